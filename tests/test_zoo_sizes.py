"""The published sizes the GPU benchmarks use (bench/models.py's ``full``, bench/small_models.py's
``blocks2``): their shapes check out on the meta device, without any memory."""
import pytest
import torch

pytest.importorskip("diffusers")


def _models(on_meta: bool):
    """The zoo's models that run on the meta device (``on_meta``), or those that do not."""
    from sgdiff import zoo

    return [name for name, case in zoo.MODELS.items() if bool(case.meta) == on_meta]


@pytest.mark.parametrize("name", _models(on_meta=True))
def test_full_configs_run_on_the_meta_device(name):
    """The published sizes the GPU benchmark uses: shapes check out without any memory."""
    from sgdiff import zoo

    model, kwargs = zoo.build(name, "full", dtype=torch.bfloat16, device="meta")
    with torch.no_grad():
        out = model(**kwargs)[0]
    latents = kwargs["hidden_states"]
    assert out.shape[0] == latents.shape[0] and out.device.type == "meta"
    _comes_with_two_blocks_at_its_real_width(name, model, kwargs)


def _blocks(name: str, m: torch.nn.Module) -> bool:
    """A list of attention blocks (Wan-Animate's face adapters among them; not FIBO's per-block caption
    projections), refiners (Lumina2's: one layer each) apart."""
    return (isinstance(m, torch.nn.ModuleList) and len(m) > 0 and "refiner" not in name
            and any("attn" in n or "attention" in n or n.split(".")[-1] in ("to_q", "to_qkv")
                    for n, _ in m[0].named_modules()))


def _comes_with_two_blocks_at_its_real_width(name, full, kwargs):
    """``blocks2`` (bench/small_models.py) of model ``name`` against its ``full`` build: the full
    config's widths and inputs, two blocks (fewer tokens where the model says why)."""
    from sgdiff import zoo

    two, kwargs2 = zoo.build(name, "blocks2", dtype=torch.bfloat16, device="meta")
    dits = [getattr(model, "dit", model) for model in (full, two)]  # a ListDiT's DiT (Z-Image)
    block_lists = [[m for n, m in dit.named_children() if _blocks(n, m)] for dit in dits]
    blocks = [sum(len(m) for m in lists) for lists in block_lists]
    # one block of each kind (Flux's double and single), or two of one kind
    assert blocks[0] > 2 and blocks[1] == max(2, len(block_lists[1])), (name, blocks)
    width = [max(p.shape[-1] for p in model.parameters() if p.dim() == 2) for model in (full, two)]
    assert width[0] == width[1], name
    if zoo.MODELS[name].fewer_tokens:  # the reason said: a smaller latent of the same layout
        full_x, two_x = kwargs["hidden_states"], kwargs2["hidden_states"]
        assert full_x.dim() == two_x.dim() and full_x.numel() > two_x.numel(), name
    else:
        assert kwargs["hidden_states"].shape == kwargs2["hidden_states"].shape, name


@pytest.mark.parametrize("name", _models(on_meta=False))
def test_every_model_comes_with_two_blocks_at_its_real_width(name):
    """Those run on the meta device check it there (test_full_configs_run_on_the_meta_device)."""
    from sgdiff import zoo

    _comes_with_two_blocks_at_its_real_width(name, *zoo.build(name, "full", dtype=torch.bfloat16, device="meta"))
