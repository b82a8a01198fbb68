"""Create a tiny random-weight Llama model + locally trained tokenizer (no downloads).
# Origin: copied unchanged from the team's shared tools/vllm-cpu/ (verified 2026-11-30).
usage: python make_tiny_model.py OUTDIR"""
import json, os, shutil, subprocess, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PEERS", "peers") + "/tiny-model"
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
# tokenizer: copy TOKDIR (default $PEERS/tiny-tokenizer, trained on Faker text by
# make_tokenizer.py in the GuideLLM venv) so mocks, GuideLLM and vLLM share one vocabulary;
# otherwise train one here with make_tokenizer.py (byte-level BPE, chat template).
tokdir = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("PEERS", "peers") + "/tiny-tokenizer"
if os.path.exists(os.path.join(tokdir, "tokenizer.json")):
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(tokdir, f), out)
else:
    subprocess.check_call([sys.executable, os.path.join(here, "make_tokenizer.py"), out, "1000"])

torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, head_dim=32,  # vLLM CPU attn needs head_size>=32
    max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
    bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=True,
)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
# generation_config: avoid early EOS surprises; keep defaults simple
print(open(os.path.join(out, "config.json")).read())
print(sorted(os.listdir(out)))
