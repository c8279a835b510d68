"""Decode once, the engine's half (engine/decoded.py): a decode started with
`keep_outputs` keeps each decoder layer's output of every fed response token, which equal
the layer outputs (and the final norm's input) of one plain transformers forward over
prompt + response; the draws are those of a decode that keeps nothing, riding prefix rows
keep them too, and an export is refused once the engine decodes again in its buffers."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.full_forward import _full_sequences, full_hidden
from rollplex.engine.prefix import prefix_forward
from rollplex.engine.session import DecodeEngine
from tests.backends.torch.test_riders import G, _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

R = 6
# fp32 on CPU: the engine's fused q/k/v GEMM and its attention over the shared-prefix
# cache round differently from transformers' separate projections over one sequence
# (measured: at most 6e-8 on outputs of magnitude ~1)
TOL = {"atol": 1e-6, "rtol": 0}


def _start(model, batch, feats, keep: bool, lengths=None, seed: int = 3):
    with torch.no_grad():
        prefix = prefix_forward(model, batch.text_only(), feats.values, False)
    gen = torch.Generator().manual_seed(seed)
    engine = DecodeEngine(model, keep_workspace=True)  # as the rollout role keeps it
    return engine, engine.start(prefix, G, R, 1.0, 1.0, gen, -1, lengths=lengths, keep_outputs=keep)


def _plain_outputs(model, batch, tokens, lengths) -> torch.Tensor:
    """[layers, N, T, H]: each layer's output (the last one's: the final norm's input) at
    every position of one plain forward per row over prompt + response."""
    lm = model.model.language_model
    outs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _a, o: outs.append(o)) for layer in lm.layers]
    hooks.append(lm.norm.register_forward_pre_hook(lambda _m, a: outs.append(a[0])))
    pad = model.config.text_config.pad_token_id or 0
    ids, _, _, plen = _full_sequences(batch, tokens, lengths, G, pad)  # where each row sits
    try:
        with torch.no_grad():  # the per-sample forward verl's path runs (logprob.full_hidden)
            full_hidden(model, batch, tokens, lengths, G)
    finally:
        for h in hooks:
            h.remove()
    last_layer, final_in = outs[-2], outs[-1]
    assert torch.equal(last_layer, final_in)  # the norm's input is the last layer's output
    layers = torch.stack([*outs[:-2], final_in])
    # response token j of row i sits at plen_i + j
    idx = plen[:, None] + torch.arange(tokens.shape[1] - 1)
    idx = idx.clamp(max=ids.shape[1] - 1)
    return torch.stack([x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1])) for x in layers])


@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_kept_outputs_equal_a_plain_forward_over_prompt_and_response(spec, renderer, kind):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, kind)
    model = trainer.model
    n = batch.size * G
    forced = [R - (i % 4) for i in range(n)]  # unequal rows: 6, 5, 4, 3, ...
    _, session = _start(model, batch, feats, True, forced)
    session.advance()
    tokens, logprobs, lengths = session.result()
    assert lengths.tolist() == forced
    kept = session.kept().layers()
    layers = model.config.text_config.num_hidden_layers
    assert kept.shape == (layers, n, R - 1, model.config.text_config.hidden_size)
    want = _plain_outputs(model, batch, tokens, lengths)
    fed = torch.arange(R - 1)[None, :] < (lengths - 1)[:, None]  # tokens 0 .. len-2 are fed
    assert int(fed.sum()) > n  # several columns a row, and rows that end before the others
    worst = max(float((kept[i][fed] - want[i][fed]).abs().max()) for i in range(layers))
    print(f"kept vs plain forward, max abs difference: {worst:.2e}")
    for i in range(layers):
        torch.testing.assert_close(kept[i][fed], want[i][fed], **TOL, msg=f"layer {i}")
    assert kept[-1][fed].abs().max() > 0
    assert torch.isfinite(kept).all()  # columns past a row's end too: the loss masks them

    # keeping changes nothing the decode draws
    _, plain = _start(model, batch, feats, False, forced)
    plain.advance()
    got = plain.result()
    assert torch.equal(got[0], tokens) and torch.equal(got[1], logprobs)
    assert plain.ws.kept is None
    with pytest.raises(RuntimeError, match="kept no layer outputs"):
        plain.kept()


def test_the_kept_buffer_holds_the_real_rows_not_the_engines_padded_bucket(spec, renderer):  # noqa: F811
    """The engine pads rows to a bucket; the plan prices the kept outputs at the real rows.
    The buffer must be that size (an H100 run at 192 rows in the 256 bucket held 4.5 GiB
    more than planned), and the padding rows' outputs go nowhere."""
    batch, trainer, feats = _setup(spec, renderer, "image")
    n = batch.size * G
    _, session = _start(trainer.model, batch, feats, True)
    assert session.ws.shape.rows > n  # the bucket pads: the case this test is about
    session.advance()
    kept = session.ws.kept
    assert kept is not None and kept.shape[1] == n
    assert session.kept().layers().data_ptr() == kept.data_ptr()  # the export is the buffer


def test_a_ridden_step_keeps_the_decode_rows_outputs(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "image")
    model = trainer.model
    _, plain = _start(model, batch, feats, True)
    plain.advance()
    _, riding = _start(model, batch, feats, True)
    riding.advance(2)
    riding.ride(trainer.ride_rows(feats, batch.text_only()))  # step 2 rides
    riding.advance()
    assert torch.equal(riding.result()[0], plain.result()[0])
    torch.testing.assert_close(riding.kept().layers(), plain.kept().layers(), **TOL)


def test_an_export_is_refused_once_the_engine_decodes_again(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "image")
    engine, session = _start(trainer.model, batch, feats, True)
    session.advance()
    kept = session.kept()
    assert kept.layers().shape[1] == batch.size * G
    with torch.no_grad():
        prefix = prefix_forward(trainer.model, batch.text_only(), feats.values, False)
    engine.start(prefix, G, R, 1.0, 1.0, None, -1, keep_outputs=True)  # same shape: same buffers
    with pytest.raises(RuntimeError, match="started another decode"):
        kept.layers()
    kept.release()
    assert list(kept.tensors()) == []
    with pytest.raises(RuntimeError, match="already released"):
        kept.layers()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replayed_steps_keep_what_eager_steps_keep(spec, renderer):  # noqa: F811
    """The kept write reads its column from the step tensor, so CUDA-graph replays keep
    what eager steps keep (fp32, the same kernels uncompiled)."""
    batch, trainer, feats = _setup(spec, renderer, "mixed", "cuda")
    model = trainer.model
    outs = []
    for graphs in (False, True):
        with torch.no_grad():
            prefix = prefix_forward(model, batch.text_only(), feats.values, False)
        engine = DecodeEngine(model, use_graphs=graphs, keep_workspace=True, compile=False)
        gen = torch.Generator("cuda").manual_seed(3)
        session = engine.start(prefix, G, R, 1.0, 1.0, gen, -1, keep_outputs=True)
        session.advance()
        outs.append((session.result()[0], session.kept().layers().clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[1][1], outs[0][1], **TOL)
