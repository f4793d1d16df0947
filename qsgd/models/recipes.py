"""How each built-in model is usually trained: its per-GPU batch and its optimizer.

A prediction's defaults (the emulator's compute model) come from here, so that a user who
names no batch meets one that people train with. Sources, per model:

- ImageNet CNNs: Goyal et al., "Accurate, Large Minibatch SGD" (2017) train ResNet-50 with 32
  images per GPU on 8-GPU servers of 2017; on today's 16-80 GB GPUs under mixed precision the
  per-GPU batch is 256 (Lambda's V100 16 GB and A100 runs in ``tests/emulator/data/compute``
  use 256 and more), ResNet-152 half of it. VGG-19 and VGG-16: 256 images over 4 GPUs (Simonyan &
  Zisserman 2015, Section 3.1), 64 per GPU. AlexNet: 128 per batch (Krizhevsky et al. 2012,
  Section 5). BN-Inception: 32 per GPU (Ioffe & Szegedy 2015 train with mini-batches of 32 per
  worker). CIFAR ResNets: 128 (He et al. 2016, Section 4.2). All with momentum SGD.
- GPT-2: nanoGPT's GPT-2 recipe (``config/train_gpt2.py``: batch_size 12 at block_size 1024
  per GPU, gradient accumulation for the rest); the larger sizes shrink it to fit 80 GB.
  BERT: 32 sequences of 128 tokens per GPU (Devlin et al. 2019 pretrain at 256 sequences per
  step on 16 TPU chips; a GPU holds twice a chip's 8 GB share). ViT-B/16: 128 images per GPU
  (DeiT, Touvron et al. 2021: batch 1024 on 8 GPUs). Llama: one sequence per GPU
  (torchtitan's Llama 3 8B recipe, ``local_batch_size = 1`` at 8192 tokens). All with AdamW.
"""
from __future__ import annotations

#: model name (:data:`qsgd.models.MODELS`) -> samples per GPU per iteration
TRAINING_BATCH: dict[str, int] = {
    "resnet50": 256, "resnet152": 128, "vgg16": 64, "vgg19": 64, "alexnet": 128, "bn_inception": 32,
    "resnet110": 128, "resnet20": 128, "lstm_an4": 32, "mlp": 64,
    "gpt2": 12, "gpt2-medium": 8, "gpt2-large": 4, "gpt2-xl": 2,
    "bert-base": 32, "bert-large": 32, "vit-b16": 128,
    "llama": 1, "llama2-7b": 1, "llama2-13b": 1, "llama2-70b": 1, "llama3-8b": 1, "llama3-70b": 1,
}
#: model name -> optimizer (a key of :data:`qsgd.operators.OPTIMIZERS`)
TRAINING_OPTIMIZER: dict[str, str] = {
    **{n: "sgd" for n in ("resnet50", "resnet152", "vgg16", "vgg19", "alexnet", "bn_inception", "resnet110",
                          "resnet20", "lstm_an4", "mlp")},
    **{n: "adamw" for n in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base",
                            "bert-large", "vit-b16", "llama", "llama2-7b", "llama2-13b",
                            "llama2-70b", "llama3-8b", "llama3-70b")},
}
