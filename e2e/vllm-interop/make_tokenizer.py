"""Train a tiny byte-level BPE tokenizer locally (no downloads) and save it as a
# Origin: copied unchanged from the team's shared tools/vllm-cpu/ (verified 2026-11-30).
HF-compatible directory: tokenizer.json + tokenizer_config.json (with chat_template)
+ special_tokens_map.json.  Usage: python make_tokenizer.py OUTDIR [VOCAB]"""
import json, os, sys, random
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders

out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PEERS", "peers") + "/tiny-tokenizer"
vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
os.makedirs(out, exist_ok=True)

def corpus():
    try:
        from faker import Faker  # GuideLLM builds synthetic prompts from Faker text
        f = Faker(); f.seed_instance(0)
        for _ in range(20000):
            yield f.text(max_nb_chars=300)
    except ImportError:
        rnd = random.Random(0)
        words = "the quick brown fox jumps over lazy dog model cache token prefix router request".split()
        for _ in range(20000):
            yield " ".join(rnd.choice(words) for _ in range(40))

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train_from_iterator(corpus(), trainer=trainer)
tok.save(os.path.join(out, "tokenizer.json"))

chat_template = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
cfg = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    "model_max_length": 2048, "clean_up_tokenization_spaces": False,
    "chat_template": chat_template,
}
json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
          open(os.path.join(out, "special_tokens_map.json"), "w"), indent=2)
print("saved", out, "vocab", tok.get_vocab_size())
