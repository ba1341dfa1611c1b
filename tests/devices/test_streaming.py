"""Block streaming: a DiT whose block weights live off the module computes exactly what the resident one does.

Streaming between two CPU tensors stands in for a GPU here (the same copies, hooks and sources run; only the
side stream is missing); the CUDA side-stream path is checked when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
from quant_files import write_awq, write_quantised, write_with_kitchen
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file

from flux2_core import OutOfMemory, ReferenceLatents, SampleRequest, SampleSettings, load_transformer, sample
from flux2_core.devices.streaming import StreamedWeight, disable_streaming, enable_streaming, streamer_of
from flux2_core.dit.call import CallExtras
from flux2_core.dit.rope import image_ids, reference_ids
from flux2_core.lora import DIT, Lora
from flux2_core.ops import PLAIN, LowRankPatch, linears
from flux2_core.weights.quant_source import QuantWeight

B, H, W, T = 2, 3, 4, 7
BLOCK_BYTES = {"double": 26624 * 4, "single": 13312 * 4}  # the tiny DiT's block linears, float32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming")
    dit = make_diffusers_dit(seed=3)
    sd = bfl_state_dict(dit)
    write_quantised(sd, root / "fp8.safetensors", "float8_e4m3fn")
    write_quantised(sd, root / "int8.safetensors", "int8_tensorwise")
    write_awq(sd, root / "awq.safetensors")
    try:  # W4A8 written by comfy-kitchen's own quantiser, where it is installed
        from comfy_kitchen.tensor import AsymW4A8Int8Layout

        entry = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 16}
        write_with_kitchen(sd, root / "w4a8.safetensors", AsymW4A8Int8Layout, entry, convrot_groupsize=16)
    except ImportError:
        pass
    return {
        "plain": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "kv": write_bfl_file(dit, root / "flux-2-klein-9b-kv.safetensors"),
        "fp8": root / "fp8.safetensors",
        "int8": root / "int8.safetensors",
        "w4a8": root / "w4a8.safetensors",
        "awq": root / "awq.safetensors",
        "dev": write_bfl_file(
            make_diffusers_dit(seed=4, guidance_embeds=True), root / "flux2-dev.safetensors"
        ),
    }


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(11)
    return dict(
        x=torch.randn(B, H * W, 128, generator=g),
        ctx=torch.randn(B, T, 24, generator=g),
        ref=torch.randn(1, 2 * 3, 128, generator=g),
        t=torch.tensor([0.6, 0.6]),
    )


def forward(net, inputs):
    guidance = torch.tensor([3.5, 3.5]) if getattr(net, "guidance_in", None) is not None else None  # dev
    with torch.inference_mode():
        return net(inputs["x"], image_ids(H, W), inputs["t"], inputs["ctx"], CallExtras(guidance=guidance))


def kv_path(net, inputs):
    with torch.inference_mode():
        cache = net.encode_reference_kv(inputs["ref"], reference_ids([(2, 3)]))
        return net(inputs["x"], image_ids(H, W), inputs["t"], inputs["ctx"], CallExtras(kv_cache=cache))


def module_bytes(net) -> int:
    return sum(t.nbytes for t in net.parameters()) + sum(t.nbytes for t in net.buffers())


def fixed_bytes(net) -> int:
    """What stays whatever the budget (of a model not streamed yet): everything but the blocks' linears."""
    block_linears = [m for block in net.blocks() for _, m in linears(block)]
    return module_bytes(net) - sum(module_bytes(m) for m in block_linears)


@pytest.mark.parametrize(
    "budget, resident",
    [(0, ()), ("double", (0,)), ("double+single", (0, 2)), ("all", (0, 1, 2, 3))],
)
def test_streamed_forward_and_kv_path_are_bit_identical(files, inputs, budget, resident):
    net = load_transformer(files["plain"]).transformer
    expected, expected_kv = forward(net, inputs), kv_path(net, inputs)
    total = module_bytes(net)
    assert total - fixed_bytes(net) == 2 * BLOCK_BYTES["double"] + 2 * BLOCK_BYTES["single"]
    extra = {0: None, "double": BLOCK_BYTES["double"], "all": 10**9}
    extra["double+single"] = BLOCK_BYTES["double"] + BLOCK_BYTES["single"]
    resident_bytes = 0 if budget == 0 else fixed_bytes(net) + extra[budget]
    streamer = enable_streaming(net, "cpu", resident_bytes=resident_bytes)
    assert streamer.resident_blocks == resident
    assert streamer.streamed_blocks == tuple(i for i in range(4) if i not in resident)
    assert streamer.resident_bytes + streamer.streamed_bytes == total
    assert module_bytes(net) == streamer.resident_bytes  # what module.to() moves and the patcher counts
    assert sum(t.nbytes for t in net.state_dict().values()) == streamer.resident_bytes
    kinds = ["double", "double", "single", "single"]  # blocks in run order
    largest = max((BLOCK_BYTES[kinds[i]] for i in streamer.streamed_blocks), default=0)
    assert streamer.working_bytes == 3 * largest  # the most the copies take on the device
    for _ in range(2):
        assert torch.equal(forward(net, inputs), expected)
        assert torch.equal(kv_path(net, inputs), expected_kv)
        assert streamer.device_bytes == 0  # each block's copy dropped once the block ran


def test_every_block_streamed_keeps_only_the_small_parts(files):
    net = load_transformer(files["plain"]).transformer
    fixed = fixed_bytes(net)
    streamer = enable_streaming(net, "cpu")
    assert streamer.resident_bytes == fixed and streamer.resident_blocks == ()
    keys = net.state_dict().keys()
    assert "double_blocks.0.img_attn.qkv.weight" not in keys and "single_blocks.1.linear2.weight" not in keys
    assert "double_blocks.0.img_attn.norm.query_norm.scale" in keys  # norms stay ordinary parameters
    assert "img_in.weight" in keys and "final_layer.linear.weight" in keys
    layer = net.single_blocks[0].linear1
    assert layer.weight is None and isinstance(layer.source, StreamedWeight) and layer.source.inner is PLAIN
    assert streamer_of(net) is streamer


def test_disable_restores_the_exact_model(files, inputs):
    net = load_transformer(files["plain"]).transformer
    params = dict(net.named_parameters())
    values = {k: v.detach().clone() for k, v in net.state_dict().items()}
    sources = {name: m.source for name, m in net.named_modules() if hasattr(m, "source")}
    expected = forward(net, inputs)
    enable_streaming(net, "cpu")
    disable_streaming(net)
    assert streamer_of(net) is None
    assert dict(net.named_parameters()).keys() == params.keys()
    assert all(p is params[k] for k, p in net.named_parameters())  # the same Parameter objects
    state = net.state_dict()
    assert state.keys() == values.keys()
    assert all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in values.items())
    assert all(m.source is sources[name] for name, m in net.named_modules() if hasattr(m, "source"))
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())
    assert torch.equal(forward(net, inputs), expected)
    disable_streaming(net)  # twice: nothing to do


def test_enabling_again_replaces_the_budget(files, inputs):
    net = load_transformer(files["plain"]).transformer
    expected = forward(net, inputs)
    enable_streaming(net, "cpu")
    streamer = enable_streaming(net, "cpu", resident_bytes=fixed_bytes(net) + BLOCK_BYTES["double"])
    assert streamer.resident_blocks == (0,) and streamer_of(net) is streamer
    assert torch.equal(forward(net, inputs), expected)


STORED = {"fp8": torch.float8_e4m3fn, "int8": torch.int8, "w4a8": torch.int8, "awq": torch.int8}


def _needs_file(files, fmt: str) -> None:
    if not files[fmt].exists():
        pytest.skip("comfy-kitchen is not installed: its quantiser writes the W4A8 file")


@pytest.mark.parametrize("fmt", list(STORED))
def test_quantised_base_streams_bit_identically(files, inputs, fmt):
    _needs_file(files, fmt)
    net = load_transformer(files[fmt]).transformer
    expected, expected_kv = forward(net, inputs), kv_path(net, inputs)
    quantised = net.double_blocks[1].img_attn.qkv
    scale = "weight_s_rel" if fmt == "w4a8" else "weight_scale"  # a scale tensor of the layout
    assert isinstance(quantised.source, QuantWeight) and scale in quantised._buffers
    before = module_bytes(net)
    streamer = enable_streaming(net, "cpu", resident_bytes=fixed_bytes(net) + 1)
    assert streamer.resident_blocks == () and before - module_bytes(net) == streamer.streamed_bytes
    assert isinstance(quantised.source.inner, QuantWeight)
    assert quantised.weight is None and quantised._buffers[scale] is None
    assert f"double_blocks.1.img_attn.qkv.{scale}" not in net.state_dict()
    assert torch.equal(forward(net, inputs), expected)
    assert torch.equal(kv_path(net, inputs), expected_kv)
    disable_streaming(net)
    assert quantised.weight.dtype == STORED[fmt]
    assert torch.equal(forward(net, inputs), expected)


def _patch(layer, seed: int = 0) -> LowRankPatch:
    g = torch.Generator().manual_seed(seed)
    up, down = torch.randn(layer.out_features, 2, generator=g), torch.randn(2, layer.in_features, generator=g)
    return LowRankPatch(up, down, strength=0.5)


@pytest.mark.parametrize("fmt", ["plain", "int8", "w4a8", "dev"])
def test_lora_patches_apply_to_streamed_layers(files, inputs, fmt):
    if fmt == "w4a8":
        _needs_file(files, fmt)
    net = load_transformer(files[fmt]).transformer
    targets = [net.double_blocks[0].img_attn.qkv, net.single_blocks[1].linear1]
    if fmt == "dev":  # dev's own layers: the guidance embedder and the final layer's modulation
        targets += [net.guidance_in.in_layer, net.final_layer.adaLN_modulation[1]]
    plain = forward(net, inputs)
    for i, layer in enumerate(targets):
        layer.add_patch("test", _patch(layer, i))
    expected = forward(net, inputs)
    assert not torch.equal(expected, plain)
    enable_streaming(net, "cpu")
    assert torch.equal(forward(net, inputs), expected)
    for layer in targets:
        layer.remove_patch("test")
    assert torch.equal(forward(net, inputs), plain)


def test_sampling_with_streaming_matches_resident(files):
    model = load_transformer(files["plain"])
    g = torch.Generator().manual_seed(2)
    positive = torch.randn(1, T, 24, generator=g)
    settings = SampleSettings(80, 64, 3, 1.0, seed=5)
    name = "double_blocks.1.txt_mlp.0"
    layer = model.transformer.get_submodule(name)
    lora = Lora("test", 1.0, {DIT: {name: [_patch(layer, 7)]}}, report=None)
    expected = sample(SampleRequest(model, positive, settings))
    expected_lora = sample(SampleRequest(model.with_lora(lora), positive, settings))
    assert not torch.equal(expected, expected_lora)
    enable_streaming(model.transformer, "cpu", resident_bytes=fixed_bytes(model.transformer) + 1)
    assert torch.equal(sample(SampleRequest(model, positive, settings)), expected)
    assert torch.equal(sample(SampleRequest(model.with_lora(lora), positive, settings)), expected_lora)
    assert not layer.patches  # the LoRA came off again


def test_kv_model_sampling_with_references_streams(files):
    model = load_transformer(files["kv"])
    assert model.variant.kv_cache
    g = torch.Generator().manual_seed(4)
    positive = torch.randn(1, T, 24, generator=g)
    refs = ReferenceLatents.from_latents([torch.randn(1, 128, 2, 3, generator=g)])
    settings = SampleSettings(64, 64, 2, 1.0, seed=1)
    expected = sample(SampleRequest(model, positive, settings, references=refs))
    enable_streaming(model.transformer, "cpu")
    assert torch.equal(sample(SampleRequest(model, positive, settings, references=refs)), expected)


def test_interrupted_block_leaves_nothing_behind(files, inputs):
    net = load_transformer(files["plain"]).transformer
    expected = forward(net, inputs)
    streamer = enable_streaming(net, "cpu")

    class Stop(Exception):
        pass

    def stop(module, args):
        raise Stop

    handle = net.double_blocks[1].register_forward_pre_hook(stop)  # after the streamer's own hook
    with pytest.raises(Stop):
        forward(net, inputs)
    handle.remove()
    assert streamer.device_bytes > 0  # block 1's copy and block 2's prefetch
    streamer.release()
    assert streamer.device_bytes == 0
    with pytest.raises(Stop):  # again, without releasing: the next run drops what was left
        handle = net.double_blocks[1].register_forward_pre_hook(stop)
        forward(net, inputs)
    handle.remove()
    assert torch.equal(forward(net, inputs), expected) and streamer.device_bytes == 0


class Stopped(BaseException):
    """Like ComfyUI's InterruptProcessingException: a BaseException."""


@pytest.mark.parametrize("how", ["interrupt", "out_of_memory"])
@pytest.mark.parametrize("at_block", [1, 3])
def test_a_run_stopped_at_a_block_leaves_no_streamed_copy_on_the_device(files, how, at_block):
    """An interrupt (the sampler's per-block check) or an out-of-memory error inside block k: the stopped
    block's post-hook never runs, yet no copy of it nor of the prefetched next one remains afterwards."""
    model = load_transformer(files["plain"])
    streamer = enable_streaming(model.transformer, "cpu")
    positive = torch.randn(1, T, 24, generator=torch.Generator().manual_seed(2))
    settings = SampleSettings(64, 64, 2, 1.0, seed=3)
    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) == at_block + 1:  # before block k of the first step
            raise Stopped

    block = model.transformer.blocks()[at_block]
    seen = []

    def oom(module, args):  # inside block k: the streamer's pre-hook has brought its copy in
        seen.append(streamer.device_bytes)  # the copies present when the error strikes
        raise OutOfMemory("CUDA out of memory (stand-in)")

    error = Stopped if how == "interrupt" else OutOfMemory
    handle = block.register_forward_pre_hook(oom) if how == "out_of_memory" else None
    try:
        with pytest.raises(error):
            sample(
                SampleRequest(model, positive, settings, interrupt=interrupt if how == "interrupt" else None)
            )
    finally:
        if handle is not None:
            handle.remove()
    if how == "out_of_memory":
        assert seen and seen[0] > 0  # the stopped block's copy (and its successor's) were on the device
    assert streamer.device_bytes == 0
    expected = sample(SampleRequest(model, positive, settings))  # and the next run is a normal one
    disable_streaming(model.transformer)
    assert torch.equal(sample(SampleRequest(model, positive, settings)), expected)


def test_a_streamed_layer_called_on_its_own(files):
    net = load_transformer(files["plain"]).transformer
    layer = net.single_blocks[0].linear2
    x = torch.randn(3, layer.in_features)
    with torch.inference_mode():
        expected = layer(x)
        streamer = enable_streaming(net, "cpu")
        assert torch.equal(layer(x), expected) and streamer.device_bytes == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side-stream copies need a CUDA device")
def test_cuda_side_stream_streaming_matches_resident(files, inputs):
    net = load_transformer(files["int8"], dtype=torch.bfloat16, device="cuda").transformer
    cuda = {k: v.cuda() if k in ("x", "ctx", "ref", "t") else v for k, v in inputs.items()}
    expected, expected_kv = forward(net, cuda), kv_path(net, cuda)
    resident_memory = torch.cuda.memory_allocated()
    streamer = enable_streaming(net, "cuda")
    assert torch.cuda.memory_allocated() < resident_memory
    assert all(block.pinned for block in streamer._blocks.values())
    assert all(block.host.device.type == "cpu" for block in streamer._blocks.values())
    for _ in range(3):
        assert torch.equal(forward(net, cuda), expected)
        assert torch.equal(kv_path(net, cuda), expected_kv)
    streamer.release()
    disable_streaming(net)
    assert net.double_blocks[0].img_attn.qkv.weight.device.type == "cuda"
    assert torch.equal(forward(net, cuda), expected)


class FakeLock:
    """Stands in for cudaHostRegister / cudaHostUnregister, with their rules: a range is locked once, and
    locked ranges never overlap. ``refuse_after``: how many ranges the system grants."""

    def __init__(self, refuse_after: int | None = None):
        self.live: dict[int, int] = {}
        self.refuse_after = refuse_after

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.refuse_after is not None and len(self.live) >= self.refuse_after:
            return False
        assert all(ptr + nbytes <= p or p + n <= ptr for p, n in self.live.items()), "overlapping ranges"
        self.live[ptr] = nbytes
        return True

    def unregister(self, ptr: int) -> bool:
        return self.live.pop(ptr, None) is not None


@pytest.fixture
def lock(monkeypatch):
    from flux2_core.devices import streaming

    fake = FakeLock()
    monkeypatch.setattr(streaming, "registrar", lambda: fake)
    return fake


def test_streamed_blocks_are_page_locked_in_one_arena_at_their_exact_size(files, inputs, lock):
    """Each block's range is locked in place at its size rounded to a page, not to a power of two (which
    PyTorch's pinned allocator would take: 23% more for klein 9B's blocks)."""
    from flux2_core.devices.host_memory import PAGE, locked_bytes

    net = load_transformer(files["plain"]).transformer
    expected = forward(net, inputs)
    streamer = enable_streaming(net, "cpu", pin=True)
    blocks = list(streamer._blocks.values())
    assert len(blocks) == 4 and all(block.pinned for block in blocks)
    pages = [-(-block.host.numel() // PAGE) * PAGE for block in blocks]
    assert lock.live == {block.host.data_ptr(): n for block, n in zip(blocks, pages)}
    assert all(ptr % PAGE == 0 for ptr in lock.live)
    assert streamer.arena.nbytes == sum(pages) == locked_bytes()
    storages = {block.host.untyped_storage().data_ptr() for block in blocks}
    assert len(storages) == 1  # one allocation for the model
    assert torch.equal(forward(net, inputs), expected)
    disable_streaming(net)


def test_turning_streaming_off_copies_nothing_and_unlocks_the_memory(files, inputs, lock, caplog):
    """The weights stay where they were streamed from, now ordinary memory: host RAM never holds a block
    twice (dev: ~64 GB page-locked would otherwise meet ~60 GB of copies)."""
    from torch.overrides import TorchFunctionMode

    from flux2_core.devices.host_memory import locked_bytes

    net = load_transformer(files["plain"]).transformer
    expected = forward(net, inputs)
    streamer = enable_streaming(net, "cpu", pin=True)
    arena = streamer.arena.block(0).untyped_storage().data_ptr()
    copies = []

    class Watch(TorchFunctionMode):  # every tensor operation that produces new memory or writes into any
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.copy_ or (
                isinstance(out, torch.Tensor)
                and out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr()
            ):
                copies.append(func)
            return out

    with caplog.at_level("INFO", logger="flux2_core"), Watch():
        disable_streaming(net)
    assert copies == [] and lock.live == {} and locked_bytes() == 0
    assert net.double_blocks[0].img_attn.qkv.weight.untyped_storage().data_ptr() == arena
    assert "page-locked host memory unlocked" in caplog.text
    assert torch.equal(forward(net, inputs), expected)


def test_a_streamed_model_dropped_unlocks_its_memory(files, lock, caplog):
    """A model dropped while streamed (ComfyUI evicting it) unlocks its arena before the memory is freed."""
    import gc

    from flux2_core.devices.host_memory import locked_bytes

    net = load_transformer(files["plain"]).transformer
    enable_streaming(net, "cpu", pin=True)
    assert len(lock.live) == 4
    with caplog.at_level("INFO", logger="flux2_core"):
        del net
        gc.collect()
    assert lock.live == {} and locked_bytes() == 0
    assert "page-locked host memory unlocked (0 MiB still locked" in caplog.text


def test_blocks_the_system_will_not_lock_stream_from_ordinary_memory(files, inputs, lock, caplog):
    net = load_transformer(files["plain"]).transformer
    expected = forward(net, inputs)
    lock.refuse_after = 1
    with caplog.at_level("WARNING", logger="flux2_core"):
        streamer = enable_streaming(net, "cpu", pin=True)
    assert [block.pinned for block in streamer._blocks.values()] == [True, False, False, False]
    assert "could not page-lock" in caplog.text
    assert torch.equal(forward(net, inputs), expected)
    disable_streaming(net)
    assert lock.live == {}


def test_enabling_frees_each_blocks_originals_once_its_copy_is_in(files):
    """Streaming a loaded model holds at most one block twice, never a second copy of every block."""
    import weakref

    from torch.overrides import TorchFunctionMode

    net = load_transformer(files["plain"]).transformer
    alive = {}
    for position, block in enumerate(net.blocks()):
        for name, layer in linears(block):
            key = (position, name)
            alive[key] = True
            weakref.finalize(layer.weight.untyped_storage(), alive.__setitem__, key, False)
    counts = []

    class Watch(TorchFunctionMode):  # how many blocks still hold their original weights at each copy
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.copy_:
                counts.append(len({p for (p, _), on in alive.items() if on}))
            return func(*args, **(kwargs or {}))

    with Watch():
        enable_streaming(net, "cpu")
    assert counts[0] == 4 and counts == sorted(counts, reverse=True) and counts[-1] == 1, counts
    assert not any(alive.values())


def test_streaming_and_compile_refuse_each_other(files):
    """Streaming swaps a block's weights under its code: compiled blocks would run against stale copies."""
    from flux2_core import Flux2Error, compile_blocks

    net = load_transformer(files["plain"]).transformer
    enable_streaming(net, "cpu")
    with pytest.raises(Flux2Error, match="cannot be combined"):
        compile_blocks(net)
    disable_streaming(net)
    compile_blocks(net)  # wraps each block; nothing compiles until a block runs
    with pytest.raises(Flux2Error, match="cannot be combined"):
        enable_streaming(net, "cpu")
    assert streamer_of(net) is None
