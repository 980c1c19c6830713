"""Device side of jaxinfer: batch building, the jitted model step and on-device sampling (sampler.py)."""
