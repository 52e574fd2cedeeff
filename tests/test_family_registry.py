"""The registry's answers, pinned: every registered ``model_type``, Hugging Face architecture, flaxzoo class, GGUF
architecture and preset resolves to the family and class it resolved to when the families were registered by a
hand-written list (the tables below were printed from that registry). Gathering the records from the family folders
must leave every answer as it was, the order included: a class several families share (BERT's, the decoder's)
resolves to the earliest family that has it. A family added later adds answers and changes none of these (the checks
look at the pinned names only)."""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

from flaxzoo.models import families

ORDER = ['bert', 'roberta', 'gpt2', 'llama', 'qwen2', 'qwen3', 'mistral', 'phi3', 'gpt_neox', 'olmo2', 'gemma', 'gemma2',
 'gemma3_text', 'albert', 'electra', 'distilbert', 'xlm-roberta', 'deberta-v2', 'modernbert']
ARCHITECTURES = {'bert': {'BertModel': 'BertModel',
          'BertForMaskedLM': 'BertForMaskedLM',
          'BertForSequenceClassification': 'BertForSequenceClassification',
          'BertForTokenClassification': 'BertForTokenClassification',
          'BertForQuestionAnswering': 'BertForQuestionAnswering'},
 'roberta': {'RobertaModel': 'BertModel',
             'RobertaForMaskedLM': 'BertForMaskedLM',
             'RobertaForSequenceClassification': 'BertForSequenceClassification',
             'RobertaForTokenClassification': 'BertForTokenClassification',
             'RobertaForQuestionAnswering': 'BertForQuestionAnswering'},
 'gpt2': {'GPT2Model': 'GPTModel', 'GPT2LMHeadModel': 'GPTForCausalLM'},
 'llama': {'LlamaModel': 'GPTModel',
           'LlamaForCausalLM': 'GPTForCausalLM',
           'LlamaForSequenceClassification': 'GPTForSequenceClassification'},
 'qwen2': {'Qwen2Model': 'GPTModel',
           'Qwen2ForCausalLM': 'GPTForCausalLM',
           'Qwen2ForSequenceClassification': 'GPTForSequenceClassification'},
 'qwen3': {'Qwen3Model': 'GPTModel',
           'Qwen3ForCausalLM': 'GPTForCausalLM',
           'Qwen3ForSequenceClassification': 'GPTForSequenceClassification'},
 'mistral': {'MistralModel': 'GPTModel',
             'MistralForCausalLM': 'GPTForCausalLM',
             'MistralForSequenceClassification': 'GPTForSequenceClassification'},
 'phi3': {'Phi3Model': 'GPTModel',
          'Phi3ForCausalLM': 'GPTForCausalLM',
          'Phi3ForSequenceClassification': 'GPTForSequenceClassification'},
 'gpt_neox': {'GPTNeoXModel': 'GPTModel',
              'GPTNeoXForCausalLM': 'GPTForCausalLM',
              'GPTNeoXForSequenceClassification': 'GPTForSequenceClassification'},
 'olmo2': {'Olmo2Model': 'GPTModel',
           'Olmo2ForCausalLM': 'GPTForCausalLM',
           'Olmo2ForSequenceClassification': 'GPTForSequenceClassification'},
 'gemma': {'GemmaModel': 'GPTModel',
           'GemmaForCausalLM': 'GPTForCausalLM',
           'GemmaForSequenceClassification': 'GPTForSequenceClassification'},
 'gemma2': {'Gemma2Model': 'GPTModel',
            'Gemma2ForCausalLM': 'GPTForCausalLM',
            'Gemma2ForSequenceClassification': 'GPTForSequenceClassification'},
 'gemma3_text': {'Gemma3TextModel': 'GPTModel',
                 'Gemma3ForCausalLM': 'GPTForCausalLM',
                 'Gemma3TextForSequenceClassification': 'GPTForSequenceClassification'},
 'albert': {'AlbertModel': 'BertModel',
            'AlbertForMaskedLM': 'BertForMaskedLM',
            'AlbertForSequenceClassification': 'BertForSequenceClassification',
            'AlbertForTokenClassification': 'BertForTokenClassification',
            'AlbertForQuestionAnswering': 'BertForQuestionAnswering'},
 'electra': {'ElectraModel': 'BertModel',
             'ElectraForPreTraining': 'ElectraForPreTraining',
             'ElectraForMaskedLM': 'BertForMaskedLM',
             'ElectraForSequenceClassification': 'BertForSequenceClassification',
             'ElectraForTokenClassification': 'BertForTokenClassification',
             'ElectraForQuestionAnswering': 'BertForQuestionAnswering'},
 'distilbert': {'DistilBertModel': 'BertModel',
                'DistilBertForMaskedLM': 'BertForMaskedLM',
                'DistilBertForSequenceClassification': 'BertForSequenceClassification',
                'DistilBertForTokenClassification': 'BertForTokenClassification',
                'DistilBertForQuestionAnswering': 'BertForQuestionAnswering'},
 'xlm-roberta': {'XLMRobertaModel': 'BertModel',
                 'XLMRobertaForMaskedLM': 'BertForMaskedLM',
                 'XLMRobertaForSequenceClassification': 'BertForSequenceClassification',
                 'XLMRobertaForTokenClassification': 'BertForTokenClassification',
                 'XLMRobertaForQuestionAnswering': 'BertForQuestionAnswering'},
 'deberta-v2': {'DebertaV2Model': 'BertModel',
                'DebertaV2ForMaskedLM': 'BertForMaskedLM',
                'DebertaV2ForSequenceClassification': 'BertForSequenceClassification',
                'DebertaV2ForTokenClassification': 'BertForTokenClassification',
                'DebertaV2ForQuestionAnswering': 'BertForQuestionAnswering'},
 'modernbert': {'ModernBertModel': 'ModernBertModel',
                'ModernBertForMaskedLM': 'ModernBertForMaskedLM',
                'ModernBertForSequenceClassification': 'ModernBertForSequenceClassification',
                'ModernBertForTokenClassification': 'ModernBertForTokenClassification',
                'ModernBertForQuestionAnswering': 'ModernBertForQuestionAnswering'}}
FAMILY_OF_CLASS = {'BertModel': 'bert',
 'BertForMaskedLM': 'bert',
 'BertForSequenceClassification': 'bert',
 'BertForTokenClassification': 'bert',
 'BertForQuestionAnswering': 'bert',
 'GPTModel': 'gpt2',
 'GPTForCausalLM': 'gpt2',
 'GPTForSequenceClassification': 'llama',
 'ElectraForPreTraining': 'electra',
 'ModernBertModel': 'modernbert',
 'ModernBertForMaskedLM': 'modernbert',
 'ModernBertForSequenceClassification': 'modernbert',
 'ModernBertForTokenClassification': 'modernbert',
 'ModernBertForQuestionAnswering': 'modernbert'}
GGUF = {'llama': 'llama',
 'qwen2': 'qwen2',
 'qwen3': 'qwen3',
 'phi3': 'phi3',
 'gemma': 'gemma',
 'gemma2': 'gemma2',
 'gemma3': 'gemma3_text'}
PRESETS = {'bert-base-uncased': ('bert', 'BertForMaskedLM'),
 'bert-large-uncased': ('bert', 'BertForMaskedLM'),
 'all-minilm-l6-v2': ('bert', 'BertForMaskedLM'),
 'bert-tiny': ('bert', 'BertForMaskedLM'),
 'gpt2': ('gpt2', 'GPTForCausalLM'),
 'gpt2-medium': ('gpt2', 'GPTForCausalLM'),
 'gpt2-large': ('gpt2', 'GPTForCausalLM'),
 'gpt2-xl': ('gpt2', 'GPTForCausalLM'),
 'gpt2-tiny': ('gpt2', 'GPTForCausalLM'),
 'smollm2-135m': ('llama', 'GPTForCausalLM'),
 'llama-3.2-1b': ('llama', 'GPTForCausalLM'),
 'llama-tiny': ('llama', 'GPTForCausalLM'),
 'qwen2.5-0.5b': ('qwen2', 'GPTForCausalLM'),
 'qwen3-0.6b': ('qwen3', 'GPTForCausalLM'),
 'mistral-7b': ('mistral', 'GPTForCausalLM'),
 'phi-3-mini': ('phi3', 'GPTForCausalLM'),
 'pythia-160m': ('gpt_neox', 'GPTForCausalLM'),
 'olmo-2-1b': ('olmo2', 'GPTForCausalLM'),
 'gemma-3-270m': ('gemma3_text', 'GPTForCausalLM'),
 'albert-base-v2': ('albert', 'BertForMaskedLM'),
 'electra-small-discriminator': ('electra', 'BertForMaskedLM'),
 'distilbert-base-uncased': ('distilbert', 'BertForMaskedLM'),
 'xlm-roberta-base': ('xlm-roberta', 'BertForMaskedLM'),
 'deberta-v3-small': ('deberta-v2', 'BertForMaskedLM'),
 'modernbert-base': ('modernbert', 'ModernBertForMaskedLM'),
 'modernbert-tiny': ('modernbert', 'ModernBertForMaskedLM')}
LORA_TARGETS = [('attention', '(^|\\.)(cross_)?attention\\.(query|key|value|out)$'),
 ('mlp', '(^|\\.)mlp\\.(up|gate|down)$'),
 ('query', '(^|\\.)(cross_)?attention\\.query$'),
 ('key', '(^|\\.)(cross_)?attention\\.key$'),
 ('value', '(^|\\.)(cross_)?attention\\.value$'),
 ('out', '(^|\\.)(cross_)?attention\\.out$'),
 ('cross_attention', '(^|\\.)cross_attention\\.(query|key|value|out)$'),
 ('up', '(^|\\.)mlp\\.up$'),
 ('gate', '(^|\\.)mlp\\.gate$'),
 ('down', '(^|\\.)mlp\\.down$'),
 ('head', '^(?!(backbone|shared)(\\.|$)|(encoder|decoder)\\.).+$')]


def test_the_order_of_the_families():
    assert [model_type for model_type in families.FAMILIES if model_type in ORDER] == ORDER


def test_every_model_type_and_architecture_resolves_as_before():
    for model_type, architectures in ARCHITECTURES.items():
        family = families.family_of(model_type)
        assert family.model_type == model_type
        assert {name: cls.__name__ for name, cls in family.architectures.items()} == architectures
        for name, cls_name in architectures.items():
            for hf in ({"model_type": model_type, "architectures": [name]}, {"architectures": [name]}):
                found, cls = families.family_and_class(hf, None)
                assert (found, cls.__name__) == (family, cls_name), (hf, found.model_type, cls)


def test_every_class_resolves_to_the_same_family():
    classes = families.model_classes()
    assert [name for name in classes if name in FAMILY_OF_CLASS] == list(FAMILY_OF_CLASS)
    for name, model_type in FAMILY_OF_CLASS.items():
        assert families.family_of_class(classes[name]).model_type == model_type, name
        assert families.model_class(name) is classes[name]
        assert families.is_decoder_class(classes[name]) == families.family_of(model_type).causal


def test_gguf_presets_and_lora_targets_resolve_as_before():
    assert {a: families.gguf_family(a).model_type for a in GGUF} == GGUF
    assert [name for name in families.PRESETS if name in PRESETS] == list(PRESETS)
    for name, (model_type, cls_name) in PRESETS.items():
        config = families.get_preset(name)
        assert config.model_type == model_type and families.default_model_class(config).__name__ == cls_name
    assert [item for item in families.lora_targets().items() if item[0] in dict(LORA_TARGETS)] == LORA_TARGETS


# ------------------------------------------------------------------------------------------------ gathered, not listed

def test_every_registered_record_comes_from_a_folder():
    folders = sorted(p.name for p in pathlib.Path(families.__file__).parent.iterdir() if (p / "__init__.py").is_file())
    assert [folder.__name__.rsplit(".", 1)[1] for folder in families.FOLDERS] == folders
    records = [record for folder in families.FOLDERS for record in folder.RECORDS.values()]
    assert set(ORDER) <= {record.model_type for record in records}
    assert all(families.FAMILIES[record.model_type] is record for record in records)
    places = [place for folder in families.FOLDERS for place in folder.RECORDS]
    assert len(places) == len(set(places)) == len(records)
    assert max(families.last_added(families.FOLDERS).RECORDS) == max(places)


def write_folder(root: pathlib.Path, name: str, places: dict[int, str]) -> None:
    """A family folder ``root/name`` whose RECORDS are Llama's record under other ``model_type``s."""
    (root / name).mkdir()
    records = ", ".join(f"{place}: replace(llama.FAMILY, model_type={model_type!r}, architectures={{}}, gguf=None, "
                        f"presets={{}})" for place, model_type in places.items())
    (root / name / "__init__.py").write_text("from dataclasses import replace\n\n"
                                             "from flaxzoo.models.families import llama\n\n"
                                             f"RECORDS = {{{records}}}\n")


@pytest.fixture
def package(tmp_path, monkeypatch):
    """An empty package ``fake_families`` on sys.path (its imported modules removed afterwards)."""
    (tmp_path / "fake_families").mkdir()
    (tmp_path / "fake_families" / "__init__.py").write_text("")
    (tmp_path / "fake_families" / "notes.py").write_text("")  # a module, not a folder: no family
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "fake_families"
    for name in [n for n in sys.modules if n == "fake_families" or n.startswith("fake_families.")]:
        del sys.modules[name]


def test_a_new_folder_is_gathered_in_the_order_of_its_places(package):
    write_folder(package, "zeta", {20: "zeta"})
    write_folder(package, "alpha", {21: "alpha", 19: "alpha-older"})
    folders = families.family_folders(importlib.import_module("fake_families"))
    assert [folder.__name__ for folder in folders] == ["fake_families.alpha", "fake_families.zeta"]
    assert [record.model_type for record in families.gathered(folders)] == ["alpha-older", "zeta", "alpha"]
    assert families.last_added(folders).__name__ == "fake_families.alpha"


def test_a_folder_without_records_or_a_place_taken_twice_is_refused(package):
    write_folder(package, "one", {5: "one"})
    write_folder(package, "two", {5: "two"})
    folders = families.family_folders(importlib.import_module("fake_families"))
    with pytest.raises(ValueError, match=r"fake_families.two: place 5 of RECORDS is already fake_families.one's"):
        families.gathered(folders)
    (package / "three").mkdir()
    (package / "three" / "__init__.py").write_text("FAMILY = None\n")
    with pytest.raises(ValueError, match=r"fake_families.three: a family folder's __init__.py exports RECORDS"):
        families.gathered([importlib.import_module("fake_families.three")])
