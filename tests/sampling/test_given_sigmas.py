"""A schedule given as a list of sigmas (``SampleSettings.with_sigmas``): used as given for every FLUX.2
family, a final 0 appended, img2img's strength and the step ranges counting the list's steps, bad lists
refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core import ReferenceLatents, SampleRequest, SampleSettings, load_transformer, sample
from flux2_core import sampling as sampling_module
from flux2_core.errors import Flux2Error
from flux2_core.flow import given_sigmas
from flux2_core.sampling import get_sigmas
from flux2_core.steering.reference_strength import ReferenceStrength

# fal's FLUX.2-dev-Turbo list (its model card): 8 values, 7 steps ending above 0 until the 0 is appended
TURBO = [1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sigmas")
    klein = write_bfl_file(make_diffusers_dit(seed=3), root / "flux-2-klein-4b.safetensors")
    dev = write_bfl_file(make_diffusers_dit(seed=4, guidance_embeds=True), root / "flux2-dev.safetensors")
    return {
        "distilled": load_transformer(klein, variant="distilled"),
        "base": load_transformer(klein, variant="base"),
        "dev": load_transformer(dev),
    }


def _text(seed=1):
    return torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(seed))


def _run(monkeypatch, request):
    """(latents, the sigmas the Euler loop ran, the timesteps the DiT saw)."""
    seen, times = [], []
    euler = sampling_module.euler

    def recording(denoise, x, sigmas, *rest):
        seen.append(list(sigmas))
        return euler(denoise, x, sigmas, *rest)

    net = request.model.transformer
    handle = net.register_forward_pre_hook(lambda m, args: times.append(float(args[2].reshape(-1)[0])))
    monkeypatch.setattr(sampling_module, "euler", recording)
    try:
        out = sample(request)
    finally:
        handle.remove()
        monkeypatch.setattr(sampling_module, "euler", euler)
    (sigmas,) = seen
    return out, sigmas, times


def test_the_own_schedule_given_as_a_list_is_the_same_run(models):
    settings = SampleSettings(64, 80, 3, 1.0, seed=5)
    own = get_sigmas(3, settings.grid[0] * settings.grid[1])
    given = settings.with_sigmas(own)
    assert given.steps == 3 and given.schedule() == own.tolist() == settings.schedule()
    model = models["distilled"]
    assert torch.equal(
        sample(SampleRequest(model, _text(), given)), sample(SampleRequest(model, _text(), settings))
    )


@pytest.mark.parametrize("variant", ["distilled", "base", "dev"])
def test_a_list_is_run_as_given_for_every_family(models, monkeypatch, variant):
    model = models[variant]
    settings = SampleSettings(64, 80, 28, 4.0 if variant != "distilled" else 1.0, seed=2).with_sigmas(TURBO)
    expected = torch.tensor([*TURBO, 0.0], dtype=torch.float32).tolist()
    assert settings.steps == 8 and settings.schedule() == expected  # steps come from the list, not the 28
    negative = _text(9) if variant == "base" else None
    out, sigmas, times = _run(monkeypatch, SampleRequest(model, _text(), settings, negative=negative))
    assert sigmas == expected
    passes = 2 if variant == "base" else 1  # true CFG: two model passes a step
    assert times[::passes] == pytest.approx(expected[:-1], abs=0, rel=1e-7)
    default = sample(SampleRequest(model, _text(), SampleSettings(64, 80, 8, settings.guidance, 2),
                                   negative=negative))  # fmt: skip
    assert not torch.equal(out, default)  # the list, not the model's own 8-step schedule


def test_img2img_strength_and_step_ranges_count_the_list(models, monkeypatch):
    model = models["dev"]
    settings = SampleSettings(64, 80, 50, 4.0, seed=2).with_sigmas(TURBO)
    start = torch.randn(1, 128, 5, 4, generator=torch.Generator().manual_seed(4))
    _, sigmas, _ = _run(monkeypatch, SampleRequest(model, _text(), settings, start=start, strength=0.5))
    assert sigmas == settings.schedule()[4:]  # 8 steps at strength 0.5: the last 4
    ref = torch.randn(1, 128, 2, 2, generator=torch.Generator().manual_seed(6))
    early = ReferenceStrength(0.8, 0.0, 0.25)  # steps 0 and 1 of the list's 8 (0/8, 1/8 < 0.25)
    late = replace(ReferenceLatents.from_latents([ref]), strengths=(early,))
    with pytest.raises(Flux2Error, match="reference 1"):  # those steps are skipped at strength 0.5
        SampleRequest(model, _text(), settings, references=late, start=start, strength=0.5)
    SampleRequest(model, _text(), settings, references=late)  # from pure noise they run


@pytest.mark.parametrize(
    "values, message",
    [
        ([1.0], "give at least two values"),
        ([], "give at least two values"),
        ([1.2, 0.5, 0.0], "1.2 is outside [0, 1]"),
        ([1.0, 0.5, -0.1], "-0.1 is outside [0, 1]"),
        ([1.0, float("nan"), 0.0], "nan is outside [0, 1]"),
        ([1.0, 0.5, 0.6, 0.0], "not decreasing (0.5 then 0.6)"),
        ([1.0, 0.5, 0.5, 0.0], "not decreasing (0.5 then 0.5)"),
    ],
)
def test_bad_lists_are_refused_by_name(values, message):
    with pytest.raises(Flux2Error) as e:
        given_sigmas(values)
    assert message in str(e.value) and "e.g. 1.0, 0.75" in str(e.value)


def test_a_final_zero_is_appended_once_and_settings_made_by_hand_are_checked():
    assert given_sigmas([1.0, 0.5]) == (1.0, 0.5, 0.0) and given_sigmas(torch.tensor([1.0, 0.5, 0.0])) == (
        1.0, 0.5, 0.0)  # fmt: skip
    with pytest.raises(Flux2Error, match="with_sigmas"):
        SampleSettings(64, 64, 4, 1.0, 0, sigmas=(1.0, 0.5, 0.0)).check()
