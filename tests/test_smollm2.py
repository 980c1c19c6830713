"""The real model: SmolLM2-135M-Instruct from its GGUF, greedy continuations equal transformers' (float32)."""
import pytest
import torch

import jaxinfer
from jaxinfer import SamplingParams

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colors."}],
]
RAW = ["The quick brown fox", "def fibonacci(n):\n    "]
N_NEW = 24


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    # tests/serving/test_server.py's engine shape: its compiled programs (in JAX's persistent cache) serve this one
    return jaxinfer.LLM(smollm2_gguf, dtype="float32", num_pages=256, max_model_len=512,
                        max_num_batched_tokens=128, max_num_seqs=16, progress=False)


@pytest.fixture(scope="module")
def reference(smollm2_transformers):
    return smollm2_transformers  # transformers' float32 model of the same GGUF (conftest: one load per session)


def _reference_greedy(model, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=N_NEW, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_greedy_matches_transformers(llm, reference):
    tok = llm.tokenizer
    prompts = [tok.apply_chat_template(c) for c in CHATS] + [tok.encode(t) for t in RAW]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N_NEW), use_tqdm=False)
    for ids, out in zip(prompts, outs):
        ref = _reference_greedy(reference, ids)
        got = out.outputs[0].token_ids
        # transformers stops at eos too; compare up to and including it
        assert got == ref[:len(got)] and (len(got) == len(ref) or got[-1] in tok.eos_token_ids), (
            tok.decode(got), tok.decode(ref))
        assert out.outputs[0].text == tok.decode([t for t in got if t not in tok.eos_token_ids])


def test_api_gaps(llm, smollm2_gguf, monkeypatch):
    """get_tokenizer() is the Hugging Face tokenizer; chat refuses an empty conversation and a message without
    content by name; jaxinfer.generate() runs on this LLM instead of loading the model again."""
    hf = llm.get_tokenizer()
    assert hf.encode("The quick brown fox") == llm.tokenizer.encode("The quick brown fox")
    with pytest.raises(ValueError, match="non-empty list of messages"):
        llm.chat([])
    with pytest.raises(ValueError, match="message 1 of the conversation has no 'content'"):
        llm.chat([{"role": "system", "content": "Be terse."}, {"role": "user"}])
    with pytest.raises(ValueError, match="no 'role'"):
        llm.chat([{"content": "hi"}])
    want = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    monkeypatch.setattr(jaxinfer.api.LLM, "__init__", lambda *a, **k: pytest.fail("generate() built a second LLM"))
    got = jaxinfer.generate("The quick brown fox", model=smollm2_gguf, temperature=0, max_tokens=6)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_chat_api_answers(llm):
    out = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=16))[0]
    assert "Paris" in out.outputs[0].text


def test_stop_string_is_cut(llm):
    full = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].text
    stop_at = full.index("Paris")
    cut = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=16, stop=["Paris"]))[0].outputs[0]
    assert cut.text == full[:stop_at] and cut.finish_reason == "stop" and cut.stop_reason == "Paris"
