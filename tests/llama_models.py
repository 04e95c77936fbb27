"""Tiny GGUF MoE models for the llama.cpp tests, built offline from tests/hf_models.py's configs.

``gguf_model(name, tmp_path_factory)`` saves a tiny random fp32 transformers
model (``qwen3_moe`` or ``mixtral``) and a tiny byte-level BPE tokenizer
trained here with the ``tokenizers`` library, converts it with llama.cpp's
own ``convert_hf_to_gguf.py --outtype f32`` (the unpacked llama-cpp-python
sdist's ``vendor/llama.cpp``, named by ``TURBOSPARK_LLAMA_CPP_SRC``), and
returns the paths; each model is built once per session.

The converter refuses a tokenizer whose pre-tokenizer hash it does not know
(``TextModel.get_vocab_base_pre``); a home-made one has no entry, so that one
lookup is replaced, in the converter's own process, by the answer
``"default"`` (llama.cpp's generic BPE pre-tokenizer). Nothing else of the
converter is touched.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
from typing import Any

from conftest import require_module, skip_or_fail

# hf_models imports transformers: a run without it (or without llama.cpp) skips these tests'
# modules at collection, as require_module says, rather than erroring on the import.
for _needed in ("llama_cpp", "torch", "transformers"):
    require_module(_needed)

import hf_models  # noqa: E402

SRC_VARIABLE = "TURBOSPARK_LLAMA_CPP_SRC"
# qwen3_moe without the dense middle layer: llama.cpp's qwen3moe graph routes every layer.
EXTRA = {"qwen3_moe": dict(mlp_only_layers=[]), "mixtral": {}}
WORDS = hf_models.WORDS

_CONVERT = """
import runpy, sys
src = sys.argv[1]
sys.path[0:0] = [src, src + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
sys.argv = [src + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


@dataclasses.dataclass(frozen=True)
class Built:
    name: str
    folder: pathlib.Path  # the transformers checkpoint
    gguf: pathlib.Path
    layers: int
    experts: int
    top_k: int


_built: dict[str, Built] = {}


def converter_source() -> pathlib.Path:
    """llama.cpp's source folder holding convert_hf_to_gguf.py; skip_or_fail when it is not given."""
    value = os.environ.get(SRC_VARIABLE)
    if not value or not (pathlib.Path(value) / "convert_hf_to_gguf.py").is_file():
        skip_or_fail(f"{SRC_VARIABLE} must name llama.cpp's source folder (the llama-cpp-python sdist's vendor/llama.cpp, "
                     f"holding convert_hf_to_gguf.py); got {value!r}")
    return pathlib.Path(value)


def bpe_tokenizer() -> Any:
    """A byte-level BPE (all 256 bytes plus merges over WORDS, ids 0-2 special), trained offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers as hf

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[PAD]", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator([" ".join(WORDS)] * 4, trainer=trainer)
    return hf.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="<s>", eos_token="</s>")


def hf_model(name: str, vocab: int) -> Any:
    """The tiny fp32 transformers model of ``name`` (tests/hf_models.py's config, ``vocab`` tokens)."""
    torch = require_module("torch")
    config_class, model_class, extra, *_ = hf_models.ARCHITECTURES[name]
    config = config_class(**{**hf_models.COMMON, **extra, **EXTRA[name], "vocab_size": vocab})
    torch.manual_seed(0)
    return model_class(config).eval()


def gguf_model(name: str, tmp_path_factory: Any) -> Built:
    """``name``'s checkpoint and its f32 GGUF, built once per session."""
    if name in _built:
        return _built[name]
    require_module("llama_cpp")
    require_module("sentencepiece")  # the converter imports it for Mixtral (llama) checkpoints
    src = converter_source()
    folder = tmp_path_factory.mktemp(f"hf-{name}")
    tokenizer = bpe_tokenizer()
    vocab = len(tokenizer)
    model = hf_model(name, vocab)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = folder / f"{name}-f32.gguf"
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(src), str(folder), "--outtype", "f32", "--outfile", str(out)],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"})
    assert done.returncode == 0 and out.is_file(), f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}"
    _, _, _, _, experts, top_k = hf_models.ARCHITECTURES[name]
    built = Built(name, folder, out, hf_models.COMMON["num_hidden_layers"], experts, top_k)
    _built[name] = built
    return built
