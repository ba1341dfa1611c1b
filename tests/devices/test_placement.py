"""One DiT split across devices in one process (``placement``): the split follows the weight bytes, every
block's inputs are moved to its device, and the output is bit-identical to the unsplit model. Two CPU
"devices" stand in for two GPUs here (the moves are then no-ops that are still made and counted); the test on
real GPUs runs when two are present."""

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core import hooks, load_transformer
from flux2_core.devices import placement as placement_module
from flux2_core.devices.placement import parse_devices, place_blocks, plan_split, remove_placement
from flux2_core.dit.call import CallExtras
from flux2_core.dit.rope import image_ids, reference_ids
from flux2_core.errors import Flux2Error
from flux2_core.flux1 import Flux1Transformer
from flux2_core.flux1.config import Flux1Config
from flux2_core.ops import linears


def test_plan_split_follows_the_shares_and_keeps_runs_contiguous():
    assert plan_split([10] * 8, [1, 1]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert plan_split([10] * 8, [1, 3]) == [0, 0, 1, 1, 1, 1, 1, 1]
    # the parts outside the blocks count on the first device
    assert plan_split([10] * 8, [1, 1], first_extra=40) == [0, 0, 1, 1, 1, 1, 1, 1]
    assert plan_split([10] * 6, [1, 1, 1]) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(Flux2Error, match="shares"):
        plan_split([10], [0, 0])


def _inputs(config, batch=2, guidance=None, device="cpu"):
    """The DiT call's arguments: the tensors on ``device``, the ids on the CPU."""
    torch.manual_seed(0)
    x_ids, ref_ids = image_ids(4, 6), reference_ids([(4, 4)])
    x = torch.randn(batch, 24, config.in_channels).to(device)
    t = torch.tensor([0.7] * batch).to(device)
    ctx = torch.randn(batch, 7, config.context_in_dim).to(device)
    ref = torch.randn(1, 16, config.in_channels).to(device)
    return x, x_ids, t, ctx, CallExtras(references=(ref, ref_ids), guidance=guidance)


def test_split_klein_is_bit_identical_and_moves_every_block_input(tmp_path, monkeypatch):
    model = load_transformer(write_bfl_file(make_diffusers_dit(seed=3), tmp_path / "klein.safetensors"))
    net = model.transformer
    args = _inputs(net.config)
    with torch.no_grad():
        whole = net(*args)
    moves = []
    device_of = placement_module._device_of

    def counting_device_of(module):  # once per hook call: a block (or the final layer) about to run
        moves.append(device_of(module))
        return moves[-1]

    placement = place_blocks(net, ["cpu", "cpu"])
    blocks = len(net.blocks())
    block_bytes = [sum(p.nbytes for p in b.parameters()) for b in net.blocks()]
    rest = sum(p.nbytes for p in net.parameters()) - sum(block_bytes)
    assert placement.block_device == plan_split(block_bytes, [1, 1], rest)
    assert set(placement.block_device) == {0, 1} and placement.block_device == sorted(placement.block_device)
    monkeypatch.setattr(placement_module, "_device_of", counting_device_of)
    with torch.no_grad():
        split = net(*args)
    monkeypatch.undo()
    assert torch.equal(split, whole)
    assert moves == [torch.device("cpu")] * (blocks + 1)  # each block's inputs, then the final layer's
    assert "blocks 0-" in placement.describe()
    assert sum(placement.bytes_per_device) == sum(p.nbytes for p in net.parameters())
    assert placement.bytes_per_device[1] == sum(b for b, d in zip(block_bytes, placement.block_device) if d)
    remove_placement(net)
    assert not net.blocks()[0]._forward_pre_hooks


def test_split_fill_model_is_bit_identical():
    torch.manual_seed(0)
    net = Flux1Transformer(Flux1Config(hidden_size=256, num_heads=2, depth=2, depth_single_blocks=2,
                                       context_in_dim=32, vec_in_dim=16)).eval()  # fmt: skip
    for p in net.parameters():
        torch.nn.init.normal_(p, 0, 0.05)
    from flux2_core.flux1.transformer import image_ids as fill_ids

    args = (torch.randn(1, 12, 384), fill_ids(3, 4), torch.tensor([0.5]), torch.randn(1, 5, 32),
            CallExtras(pooled=torch.randn(1, 16), guidance=torch.tensor([30.0])))  # fmt: skip
    with torch.no_grad():
        whole = net(*args)
        place_blocks(net, ["cpu", "cpu", "cpu"])
        assert torch.equal(net(*args), whole)


def test_split_dev_with_a_lora_is_bit_identical(tmp_path):
    """A dev LoRA on every linear (the guidance embedder, modulations and final layer included) follows each
    layer to its device: the split model with the LoRA gives the unsplit one's output bit for bit."""
    from safetensors.torch import save_file

    from flux2_core.lora import applied, prepare_lora, read_lora

    dit = make_diffusers_dit(seed=5, guidance_embeds=True)
    net = load_transformer(write_bfl_file(dit, tmp_path / "flux2-dev.safetensors")).transformer
    g, tensors = torch.Generator().manual_seed(6), {}
    for name, layer in linears(net):
        tensors[f"diffusion_model.{name}.lora_A.weight"] = (
            torch.randn(4, layer.in_features, generator=g) * 0.2
        )
        tensors[f"diffusion_model.{name}.lora_B.weight"] = (
            torch.randn(layer.out_features, 4, generator=g) * 0.2
        )
    assert "diffusion_model.guidance_in.in_layer.lora_A.weight" in tensors
    save_file(tensors, str(tmp_path / "dev-lora.safetensors"))
    lora = prepare_lora(read_lora(tmp_path / "dev-lora.safetensors"), net, strength=0.8)
    args = _inputs(net.config, guidance=torch.tensor([3.5, 3.5]))
    with torch.no_grad():
        plain = net(*args)
        with applied(net, None, [lora]):
            whole = net(*args)
        placement = place_blocks(net, ["cpu", "cpu"])
        with applied(net, None, [lora]):
            split = net(*args)
    assert set(placement.block_device) == {0, 1}
    assert torch.equal(split, whole)
    assert (whole - plain).abs().max() > 1e-2, "the LoRA barely changes the output"


def test_device_list_is_checked():
    assert parse_devices("cpu, cpu") == [torch.device("cpu")] * 2
    with pytest.raises(Flux2Error, match="not a device name"):
        parse_devices("gpu0")
    with pytest.raises(Flux2Error, match="does not exist"):
        parse_devices(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="splitting across GPUs needs two CUDA devices")
def test_split_across_two_gpus_matches_one(tmp_path):
    model = load_transformer(write_bfl_file(make_diffusers_dit(seed=3), tmp_path / "klein.safetensors"))
    net = model.transformer.to("cuda:0")
    args = _inputs(net.config, device="cuda:0")
    with torch.no_grad():
        whole = net(*args)
        placement = place_blocks(net, ["cuda:0", "cuda:1"])
        split = net(*args)
    assert placement.bytes_per_device[1] > 0
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-5)


def test_moves_between_split_devices_wait_unless_both_ends_are_gpus():
    """A block on the CPU must not read an input whose GPU -> CPU copy is still in flight: only GPU -> GPU
    copies are issued without waiting (ordered on the streams)."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert hooks.asynchronous(cuda, torch.device("cuda", 1))
    for source, target in ((cuda, cpu), (cpu, cuda), (cpu, cpu)):
        assert not hooks.asynchronous(source, target), (source, target)

    seen = []

    class Recording(torch.Tensor):  # records how .to() is called on it
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.to:
                seen.append((kwargs or {}).get("non_blocking", False))
            return super().__torch_function__(func, types, args, kwargs or {})

    x = torch.ones(3).as_subclass(Recording)
    moved = hooks.moved({"x": (x, [x])}, torch.device("meta"))
    assert moved["x"][0].device.type == "meta" and seen == [False, False]
