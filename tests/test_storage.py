"""Paths a run touches: object stores where the code reads them through epath and the client is installed, a clear
refusal (one line, exit code 2, before any data work) elsewhere."""

import os
import subprocess
import sys

import pytest

from flaxzoo.train import storage
from flaxzoo.train.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = {scheme: client for scheme, client in storage.CLIENTS.items()
           if not (storage.installed(client) or storage.installed("tensorflow"))}


def test_local_paths_pass_everywhere(tmp_path):
    (tmp_path / "m").mkdir()
    storage.check_paths(tmp_path / "w", data_dir=tmp_path / "d", init_from=str(tmp_path / "m"),
                        compilation_cache_dir=str(tmp_path / "c"), local_workdir=True)


def test_init_from_that_names_nothing_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "default").mkdir(parents=True)
    for fine in ["", "scratch", "runs/default", "all-minilm-l6-v2", "someone/model"]:  # a Hub id is not fetched here
        storage.check_init_from(fine)
    with pytest.raises(ConfigError, match=r"^init_from: 'runs/defualt' does not exist .*nearest: 'runs/default'"):
        storage.check_paths(tmp_path / "w", init_from="runs/defualt")
    with pytest.raises(ConfigError, match=r"^init_from: 'minilm-l6-v2' does not exist .*nearest: 'all-minilm-l6-v2'"):
        storage.check_init_from("minilm-l6-v2")


def test_pretraining_reports_a_missing_init_from_before_the_model_section(tmp_path):
    """The default config sets model.*: a missing init_from is still what the error names."""
    import importlib.util

    from flaxzoo.train.config import TrainConfig

    spec = importlib.util.spec_from_file_location("default_config", os.path.join(REPO, "configs", "default.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.init_from = str(tmp_path / "no_such_model")
    with pytest.raises(ConfigError, match=rf"^init_from: '{tmp_path}/no_such_model' does not exist"):
        TrainConfig.from_config_dict(c)


def test_fine_tuning_checks_init_from_before_reading_any_data(tmp_path, monkeypatch):
    from flaxzoo.train.finetune.config import FinetuneConfig, base_config
    from flaxzoo.train.finetune.trainer import Finetuner

    def no_data(self):
        raise AssertionError("the data was read before init_from was checked")

    monkeypatch.setattr(Finetuner, "_load_data", no_data)
    c = base_config()
    c.init_from = str(tmp_path / "no_such_encoder")
    with pytest.raises(ConfigError, match=rf"^init_from: '{tmp_path}/no_such_encoder' does not exist"):
        Finetuner(FinetuneConfig.from_config_dict(c), tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("key", ["data.data_dir", "init_from"])
def test_object_stores_behind_keys_that_read_local_files_are_refused(key):
    with pytest.raises(ConfigError, match=rf"^{key}: 'gs://bucket/x': {key} is read as local files; expected a "
                                          "local or mounted path"):
        storage.check_path("gs://bucket/x", key)


def test_an_unknown_scheme_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"^workdir: 'hdfs://nn/run': no storage of scheme hdfs://; expected a "
                                          r"local path, gs://\.\.\. or s3://\.\.\."):
        storage.check_path("hdfs://nn/run", "workdir")


@pytest.mark.skipif(not MISSING, reason="gcsfs / s3fs are installed here")
@pytest.mark.parametrize("key", ["workdir", "compilation_cache_dir"])
def test_a_missing_client_library_is_named(key):
    scheme, client = next(iter(MISSING.items()))
    with pytest.raises(ConfigError, match=rf"{scheme}:// paths need the {client} package \(pip install {client}\)"):
        storage.check_path(f"{scheme}://bucket/run", key)


def test_fine_tuning_refuses_an_object_store_work_directory():
    with pytest.raises(ConfigError, match="^workdir: 's3://b/run': fine-tuning writes its reports"):
        storage.check_paths("s3://b/run", local_workdir=True)


def test_the_command_line_refuses_in_one_line_with_exit_2_before_any_data_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train", "--workdir", str(tmp_path / "w"),
                           "--config.data.data_dir=gs://bucket/data", "--config.steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "gs://bucket/data" in line]
    assert len(errors) == 1 and "data.data_dir" in errors[0], proc.stderr[-2000:]
    assert "data:" not in proc.stdout and not (tmp_path / "w").exists()
