"""Run a script with faulthandler dumping every thread's stack after AFTER seconds (then every 40 s): where a
benchmark that overran its time limit was waiting. python benchmarks/probes/run_with_stacks.py AFTER script args"""
import faulthandler
import runpy
import sys

after = float(sys.argv[1])
faulthandler.dump_traceback_later(after, repeat=True)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
