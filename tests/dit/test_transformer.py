"""The DiT against diffusers' Flux2Transformer2DModel on the same tiny random weights, in every layout."""

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2KVAttnProcessor,
    Flux2KVParallelSelfAttnProcessor,
)
from loader_contract import LoaderContract
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file, write_diffusers_folder

from flux2_core.configs import DEV_32B, KLEIN_4B, KLEIN_9B
from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, reference_ids, text_ids
from flux2_core.dit.transformer import Flux2Transformer
from flux2_core.errors import Flux2Error

B, H, W, T = 2, 3, 4, 7


@pytest.fixture(scope="module")
def reference():
    return make_diffusers_dit(seed=1)


@pytest.fixture(scope="module")
def loaded(reference, tmp_path_factory):
    root = tmp_path_factory.mktemp("dit")
    return {
        "bfl": load_transformer(write_bfl_file(reference, root / "flux-2-klein-4b.safetensors")),
        "comfy": load_transformer(
            write_bfl_file(reference, root / "prefixed.safetensors", prefix="model.diffusion_model.")
        ),
        "diffusers": load_transformer(write_diffusers_folder(reference, root / "repo")),
    }


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(5)
    return dict(
        x=torch.randn(B, H * W, 128, generator=g),
        ctx=torch.randn(B, T, 24, generator=g),
        ref=torch.randn(B, 2 * 3 + 4 * 2, 128, generator=g),
        t=torch.tensor([0.73, 0.73]),
    )


def _diffusers(model, x, ctx, t, x_ids, **kw):
    with torch.no_grad():
        return model(
            hidden_states=x,
            encoder_hidden_states=ctx,
            timestep=t,
            img_ids=x_ids,
            txt_ids=text_ids(T),
            return_dict=False,
            **kw,
        )


def test_references_of_different_sizes_match_diffusers(reference, loaded, inputs):
    x_ids, ref_ids = image_ids(H, W), reference_ids([(2, 3), (4, 2)])
    assert ref_ids[:6, 0].eq(10).all() and ref_ids[6:, 0].eq(20).all()
    joint = torch.cat([inputs["x"], inputs["ref"]], 1)
    expected = _diffusers(reference, joint, inputs["ctx"], inputs["t"], torch.cat([x_ids, ref_ids]))[0][
        :, : H * W
    ]
    with torch.no_grad():
        got = loaded["bfl"].transformer(
            inputs["x"], x_ids, inputs["t"], inputs["ctx"], CallExtras(references=(inputs["ref"], ref_ids))
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _kv_reference(reference):
    for block in reference.transformer_blocks:
        block.attn.set_processor(Flux2KVAttnProcessor())
    for block in reference.single_transformer_blocks:
        block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())
    return reference


def test_reference_kv_and_cached_steps_match_diffusers_kv_mode(loaded, inputs):
    """Our K/V, computed from the references alone, equal those diffusers' extract step stores inside the
    joint first step; the first step (run against the cache) and a later one equal diffusers' outputs."""
    reference = _kv_reference(make_diffusers_dit(seed=1))
    net = loaded["diffusers"].transformer
    x_ids, ref_ids = image_ids(H, W), reference_ids([(2, 3), (4, 2)])
    R = ref_ids.shape[0]
    expected, kv = _diffusers(
        reference,
        torch.cat([inputs["ref"], inputs["x"]], 1),
        inputs["ctx"],
        inputs["t"],
        torch.cat([ref_ids, x_ids]),
        kv_cache_mode="extract",
        num_ref_tokens=R,
    )
    with torch.no_grad():
        cache = net.encode_reference_kv(inputs["ref"], ref_ids)
        got = net(inputs["x"], x_ids, inputs["t"], inputs["ctx"], CallExtras(kv_cache=cache))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert cache.filled and cache.num_tokens == R
    theirs = [kv.get_double(i) for i in range(2)] + [kv.get_single(i) for i in range(2)]
    for ours, layer in zip(cache.layers, theirs):  # diffusers keeps [B, R, heads, D]
        torch.testing.assert_close(ours.k, layer.k_ref.transpose(1, 2), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.v, layer.v_ref.transpose(1, 2), atol=1e-5, rtol=0)
    t2 = torch.tensor([0.2, 0.2])
    expected = _diffusers(
        reference, inputs["x"], inputs["ctx"], t2, x_ids, kv_cache_mode="cached", kv_cache=kv
    )[0]
    with torch.no_grad():
        got = net(inputs["x"], x_ids, t2, inputs["ctx"], CallExtras(kv_cache=cache))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_one_reference_cache_serves_any_prompt(loaded, inputs):
    net = loaded["bfl"].transformer
    x_ids, ref_ids = image_ids(H, W), reference_ids([(2, 3), (4, 2)])
    reference = _kv_reference(make_diffusers_dit(seed=1))
    with torch.no_grad():
        cache = net.encode_reference_kv(inputs["ref"], ref_ids)
        for ctx in (inputs["ctx"], -inputs["ctx"]):
            expected = _diffusers(
                reference,
                torch.cat([inputs["ref"], inputs["x"]], 1),
                ctx,
                inputs["t"],
                torch.cat([ref_ids, x_ids]),
                kv_cache_mode="extract",
                num_ref_tokens=ref_ids.shape[0],
            )[0]
            got = net(inputs["x"], x_ids, inputs["t"], ctx, CallExtras(kv_cache=cache))
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_empty_reference_cache_is_the_plain_forward(loaded, inputs):
    net = loaded["bfl"].transformer
    x_ids = image_ids(H, W)
    with torch.no_grad():
        plain = net(inputs["x"], x_ids, inputs["t"], inputs["ctx"])
        cache = net.encode_reference_kv(inputs["ref"][:1, :0], reference_ids([]))
        cached = net(inputs["x"], x_ids, inputs["t"], inputs["ctx"], CallExtras(kv_cache=cache))
    assert cache.num_tokens == 0
    torch.testing.assert_close(cached, plain, atol=1e-6, rtol=0)


def test_kv_cache_read_before_filled_is_a_clear_error(loaded, inputs):
    from flux2_core.dit.kv_cache import RefKVCache

    net = loaded["bfl"].transformer
    with pytest.raises(Flux2Error, match="reference KV cache is empty"):
        net(
            inputs["x"],
            image_ids(H, W),
            inputs["t"],
            inputs["ctx"],
            CallExtras(kv_cache=RefKVCache(len(net.double_blocks), len(net.single_blocks))),
        )


def test_guidance_embedding_of_the_dev_shape(tmp_path):
    reference = make_diffusers_dit(seed=2, guidance_embeds=True)
    model = load_transformer(write_bfl_file(reference, tmp_path / "dev.safetensors"))
    assert model.config.guidance_embed
    x, ctx, t, g = torch.randn(1, 4, 128), torch.randn(1, T, 24), torch.tensor([0.5]), torch.tensor([3.5])
    expected = _diffusers(reference, x, ctx, t, image_ids(2, 2), guidance=g)[0]
    with torch.no_grad():
        got = model.transformer(x, image_ids(2, 2), t, ctx, CallExtras(guidance=g))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "config, params, tensors",
    [(KLEIN_4B, 3_875_544_576, 149), (KLEIN_9B, 9_078_581_248, 201), (DEV_32B, 32_223_281_152, 299)],
)
def test_real_size_parameter_counts(config, params, tensors):
    with torch.device("meta"):
        model = Flux2Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert len(model.state_dict()) == tensors


def test_config_read_from_shapes(loaded):
    config = loaded["bfl"].config
    assert (config.hidden_size, config.num_heads, config.depth, config.depth_single_blocks) == (32, 2, 2, 2)
    assert (config.context_in_dim, config.axes_dim, config.mlp_ratio) == (24, (4, 4, 4, 4), 3.0)


@pytest.mark.parametrize(
    "name, variant",
    [
        ("flux-2-klein-4b.safetensors", "distilled"),
        ("flux-2-klein-base-9b.safetensors", "base"),
        ("flux-2-klein-9b-kv.safetensors", "kv"),
        ("FLUX.2-klein-base-4B_bf16.safetensors", "base"),
    ],
)
def test_variant_from_file_name(reference, tmp_path, name, variant):
    assert load_transformer(write_bfl_file(reference, tmp_path / name)).variant.name == variant


def test_variant_from_model_index_and_explicit_choice(reference, tmp_path):
    assert (
        load_transformer(write_diffusers_folder(reference, tmp_path / "a", is_distilled=False)).variant.name
        == "base"
    )
    assert load_transformer(write_diffusers_folder(reference, tmp_path / "b", kv=True)).variant.name == "kv"
    path = write_bfl_file(reference, tmp_path / "flux-2-klein-4b.safetensors")
    assert load_transformer(path, variant="base").variant.name == "base"
    with pytest.raises(Flux2Error, match="unknown variant 'turbo'"):
        load_transformer(path, variant="turbo")


def test_unnamed_file_defaults_to_distilled_with_a_warning(reference, tmp_path, caplog):
    model = load_transformer(write_bfl_file(reference, tmp_path / "model.safetensors"))
    assert model.variant.name == "distilled"
    assert "Choose the variant explicitly" in caplog.text


def test_packed_weights_without_a_format_marker_are_refused(reference, tmp_path):
    sd = bfl_state_dict(reference)
    sd["img_in.weight"] = torch.zeros(sd["img_in.weight"].shape, dtype=torch.uint8)
    save_file(sd, tmp_path / "flux-2-klein-4b-packed.safetensors")
    with pytest.raises(Flux2Error, match="uint8, packed integer weights with no format marker"):
        load_transformer(tmp_path / "flux-2-klein-4b-packed.safetensors")


def test_kv_cache_holds_copies_and_one_batch_item_for_shared_references(loaded, inputs):
    net = loaded["bfl"].transformer
    ref_ids = reference_ids([(2, 3), (4, 2)])
    with torch.no_grad():
        cache = net.encode_reference_kv(inputs["ref"][:1], ref_ids)
        per_item = net.encode_reference_kv(inputs["ref"][:1].expand(B, -1, -1), ref_ids)
    for layer, full in zip(cache.layers, per_item.layers):
        assert layer.k.shape[0] == 1 and full.k.shape[0] == B
        # a view would pin the whole K / fused linear1 output of the encoding run
        assert layer.k.untyped_storage().nbytes() == layer.k.numel() * layer.k.element_size()
        assert layer.v.untyped_storage().nbytes() == layer.v.numel() * layer.v.element_size()
        torch.testing.assert_close(layer.get(B)[0], full.k, atol=1e-6, rtol=0)
    # 2 layers x (K + V) x 2 heads x 14 tokens x 16 dims x 4 bytes, per double and single block
    assert cache.nbytes() == 4 * 2 * 2 * 14 * 16 * 4


def test_float16_residuals_are_clipped_instead_of_overflowing(reference, tmp_path, inputs):
    path = write_bfl_file(reference, tmp_path / "flux-2-klein-4b.safetensors")
    net = load_transformer(path, dtype=torch.float16).transformer
    with torch.no_grad():
        for p in net.double_blocks[0].img_mlp[2].parameters():
            p.mul_(3e4)  # pushes the image stream past float16's range after the first block
        out = net(inputs["x"].half(), image_ids(H, W), inputs["t"], inputs["ctx"].half())
    assert torch.isfinite(out).all()


def test_name_beats_free_text_metadata(reference, tmp_path):
    path = write_bfl_file(
        reference,
        tmp_path / "flux-2-klein-9b-kv.safetensors",
        metadata={"modelspec.title": "FLUX.2 klein 9B", "description": "not the base model"},
    )
    assert load_transformer(path).variant.name == "kv"
    plain = write_bfl_file(
        reference, tmp_path / "model.safetensors", metadata={"modelspec.title": "klein base"}
    )
    assert load_transformer(plain).variant.name == "base"


def test_file_inside_a_diffusers_repository_reads_its_model_index(reference, tmp_path):
    root = write_diffusers_folder(reference, tmp_path / "repo", is_distilled=False)
    reference.save_pretrained(root / "transformer_single", safe_serialization=True)  # one unsharded file
    (root / "transformer_single" / "config.json").unlink()
    assert (
        load_transformer(root / "transformer_single" / "diffusion_pytorch_model.safetensors").variant.name
        == "base"
    )


def test_incomplete_file_is_named(tmp_path):
    path = tmp_path / "odd.safetensors"
    save_file({"double_stream_modulation_img.lin.weight": torch.zeros(6, 1)}, path)
    with pytest.raises(Flux2Error, match="lacks img_in.weight"):
        load_transformer(path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_low_precision_attention_matches_sdpa_within_its_precision(dtype):
    from flux2_core.dit import attention
    from flux2_core.dit.block_ops import KERNELS, FusedOps, ops_for

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 2500, 64, generator=g) for _ in range(3))  # several query chunks
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with torch.no_grad():
        ops = ops_for("cpu", dtype)  # a CPU below float32: the fused ops, with the measured kernel choice
        assert isinstance(ops, FusedOps) and ops.kernels is KERNELS
        for kernel in (attention.matmul_kernel, ops.attention):  # the matrix products, and the chosen one
            got = kernel(q.to(dtype), k.to(dtype), v.to(dtype))
            assert got.dtype == dtype and got.shape == want.shape
            assert (got.float() - want).abs().max().item() < 2e-2
        plain = ops_for("cpu", torch.float32)
        assert not isinstance(plain, FusedOps)
        assert torch.equal(plain.attention(q, k, v), want)  # float32 keeps PyTorch's kernel
        assert torch.equal(attention.attend(q, k, v), want)


def test_rope_rotation_table_rotates_pairs_exactly():
    from flux2_core.dit.fused import rope_in_chunks
    from flux2_core.dit.rope import apply_rope, rope_table, rotation_table

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 12, 16, generator=g)
    table = rope_table(image_ids(3, 4), (4, 4, 4, 4), 2000)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    cos, sin = table[..., 0], table[..., 1]
    want = torch.stack([cos * x0 - sin * x1, sin * x0 + cos * x1], dim=-1).flatten(-2)
    before = x.clone()
    for form in (rotation_table(table), table):
        y = apply_rope(x, form)
        assert y is not x and y.dtype == x.dtype and torch.equal(y, want)  # a new tensor, x's dtype
        assert torch.equal(x, before)  # its input left as it was
        y = x.clone()
        assert rope_in_chunks(y, form) is y and torch.equal(y, want)  # rotated in place


def test_rope_in_chunks_is_the_whole_sequences_rotation_bit_for_bit():
    from flux2_core.dit import fused, rope

    g = torch.Generator().manual_seed(0)
    ids = rope.image_ids(40, 60)  # 2400 tokens: several chunks, the last one partial
    table = rope.rotation_table(rope.rope_table(ids, (32, 32, 32, 32), 2000))
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, 2, 2400, 128, generator=g).to(dtype)
        whole = rope.apply_rope(x, table)
        assert x.shape[2] > fused.NORM_ROPE_CHUNK and torch.equal(fused.rope_in_chunks(x, table), whole)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_qk_norm_in_chunks_is_the_whole_sequences_norm_bit_for_bit(dtype):
    """The fused q/k norm + RoPE (``fused.norm_rope``) runs ``NORM_ROPE_CHUNK`` tokens at a time: the same
    bits as the norm and rotation of every token at once, into a new tensor or over its input."""
    import torch.nn.functional as F

    from flux2_core.dit import fused, pointwise, rope

    norm = pointwise.RMSNorm(128)
    with torch.no_grad():
        norm.scale.copy_(torch.rand(128) + 0.5)
    g = torch.Generator().manual_seed(1)
    ids = rope.image_ids(40, 60)  # 2400 tokens: several chunks, the last one partial
    table = rope.rotation_table(rope.rope_table(ids, (32, 32, 32, 32), 2000))
    x = torch.randn(1, 2, 2400, 128, generator=g).to(dtype)
    assert x.shape[-2] > fused.NORM_ROPE_CHUNK and x.shape[-2] % fused.NORM_ROPE_CHUNK
    with torch.no_grad():
        normed = F.rms_norm(x.float(), (128,), norm.scale.float(), pointwise.NORM_EPS)
        whole = rope.rotated(normed, table, fused=True).to(dtype)
        got = fused.norm_rope(x, norm, table)
        assert got.dtype == dtype and torch.equal(got, whole)
        # the (cos, sin) table form too, and written over the input
        y = x.clone()
        assert fused.norm_rope(y, norm, rope.rope_table(ids, (32, 32, 32, 32), 2000), out=y) is y
        assert torch.equal(y, whole)


class TestKleinLoader(LoaderContract):
    """The FLUX.2 loader on klein files: BFL's, ComfyUI's (prefixed) and diffusers' folder."""

    LAYOUTS = ("bfl", "comfy", "diffusers")
    FOREIGN = {
        "FLUX.1 DiT": "FLUX.1 model",
        "VAE": "is a VAE, not a FLUX.2",
    }
    MISSING = "single_blocks.1.linear2.weight"
    FILE_NAME = "flux-2-klein-4b.safetensors"

    def make_reference(self):
        return make_diffusers_dit(seed=1)

    def write(self, layout, reference, folder):
        if layout == "diffusers":
            return write_diffusers_folder(reference, folder / "repo")
        prefix = "model.diffusion_model." if layout == "comfy" else ""
        return write_bfl_file(reference, folder / self.FILE_NAME, prefix=prefix)

    def write_foreign(self, name, folder):
        if name == "VAE":
            tensors = {"encoder.conv_in.weight": torch.zeros(4, 3, 3, 3)}
        else:
            tensors = {
                "img_in.weight": torch.zeros(4, 4),
                "double_blocks.0.img_mod.lin.weight": torch.zeros(4, 4),
            }
        save_file(tensors, folder / "file.safetensors")
        return folder / "file.safetensors"

    def load(self, path):
        return load_transformer(path)

    def make_inputs(self):
        g = torch.Generator().manual_seed(5)
        return (
            torch.randn(B, H * W, 128, generator=g),
            torch.randn(B, T, 24, generator=g),
            torch.tensor([0.73] * B),
        )

    def run(self, model, inputs):
        x, ctx, t = inputs
        return model.transformer(x, image_ids(H, W), t, ctx)

    def run_reference(self, reference, inputs):
        x, ctx, t = inputs
        return _diffusers(reference, x, ctx, t, image_ids(H, W))[0]

    def state_dict(self, reference):
        return bfl_state_dict(reference)
