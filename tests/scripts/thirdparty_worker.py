"""Worker for tests/test_thirdparty.py: trains third-party model code (mindformers 2.0.0's
``LlamaForCausalLM`` and ``ChatGLM2ForConditionalGeneration``, mindcv 0.3.0's ``VisionTransformer`` and
``mobilenet_v3_small_075``) a few steps with the dump off and on, in one MindSpore mode, and writes
what the test compares bit for bit.

    python thirdparty_worker.py MODE OUT RUN [RUN ...] [--model NAME] [--steps 3] [--census]

MODE: ``pynative`` | ``graph`` (process-wide). RUN: ``LEVEL:OPTIMIZER[:TASK]`` with LEVEL ``off``, ``L0``,
``L1`` or ``mix``, OPTIMIZER ``momentum`` or ``adamw``, TASK ``statistics`` (default) or ``tensor``.
NAME: a key of ``MODELS`` (``llama``, the default, ``glm2``, ``vit``, ``mobilenet``). Every run builds
the model afresh from the same seed and trains it on the same batches (tokens, or images and labels)
with ``mindspore.value_and_grad`` and the optimizer. Per run ``OUT/<LEVEL>-<OPTIMIZER>-<TASK>/`` gets
``result.json`` (float32 losses as hex bytes, the exception if one was raised, whether the model was
released afterwards, attributes left patched), ``grads_step<k>.npz`` (every parameter gradient of
step k, raw arrays) and, with the dump on, ``dump/`` (the dump path).

``--census`` (PyNative only) first runs one training step without the dump and writes
``OUT/census.json``: every sub-Cell call and the Cell whose ``construct`` made it (forward pre-hooks
and the Python stack; ``None`` for the root model), every call that model code (functions of the
model's package and the ``construct`` of the model's Cells) makes into MindSpore (``sys.setprofile``),
classified as a listed API (``support_wrap_ops.yaml``), a Primitive held by a Cell, or other, and every
Primitive that model code creates during the step.

``THIRDPARTY_WORKER_REFERRERS=1`` prints what still refers to a model that was not released.

The stand-in ``hyper_parallel`` package (``stand_ins/``) is put on ``sys.path``; mindformers is imported
from ``OUT`` because importing it creates ``./output/log``.
"""
from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import json
import os
import sys
import time
import traceback
import weakref
from typing import Any, Callable, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stand_ins"))

SEED = 1234
BATCH, SEQ, VOCAB = 2, 32, 128
IMAGE, CLASSES = 32, 10
F32 = "float32"


def parse_run(spec: str) -> tuple[str, str, str]:
    parts = spec.split(":")
    level, optimizer = parts[0], parts[1]
    task = parts[2] if len(parts) > 2 else "statistics"
    if level not in ("off", "L0", "L1", "mix") or optimizer not in ("momentum", "adamw") \
            or task not in ("statistics", "tensor"):
        raise SystemExit(f"bad run {spec!r}: LEVEL:OPTIMIZER[:TASK]")
    return level, optimizer, task


def llama_config():
    from mindformers import LlamaConfig

    return LlamaConfig(seq_length=SEQ, hidden_size=64, num_layers=2, num_heads=4, vocab_size=VOCAB,
                       intermediate_size=128, compute_dtype=F32, param_init_type=F32,
                       layernorm_compute_type=F32, softmax_compute_type=F32, rotary_dtype=F32,
                       use_past=False, use_rope_slice=True, use_flash_attention=False,
                       fused_rms_norm=False)


def llama():
    """LLaMA: RMSNorm, RoPE tables from a sub-Cell, separate q/k/v, SwiGLU; shifts labels itself."""
    from mindformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config())


def glm2():
    """ChatGLM2: grouped-query attention (2 key/value groups) with one fused, biased qkv projection,
    GLM rotary embedding, one fused gate-and-up projection, and LayerNorm (``rmsnorm=False``: the
    RMSNorm variant calls the fused ``RmsNorm`` kernel, which has no CPU implementation)."""
    from mindformers import ChatGLM2Config, ChatGLM2ForConditionalGeneration

    config = ChatGLM2Config(num_layers=2, padded_vocab_size=VOCAB, hidden_size=64, ffn_hidden_size=128,
                            kv_channels=16, num_attention_heads=4, multi_query_group_num=2,
                            seq_length=SEQ, rmsnorm=False, param_init_type=F32, compute_dtype=F32,
                            layernorm_compute_type=F32, residual_dtype=F32, rotary_dtype=F32)
    return ChatGLM2ForConditionalGeneration(config)


def whole(tokens) -> tuple:
    """The network's arguments: the whole batch (the model shifts it into inputs and labels)."""
    import mindspore as ms

    return (ms.Tensor(tokens),)


def shifted(tokens) -> tuple:
    """The network's arguments: ``input_ids`` and the labels shifted by one position."""
    import mindspore as ms

    return ms.Tensor(tokens[:, :-1]), ms.Tensor(tokens[:, 1:])


def token_batches(steps: int) -> list:
    """``steps`` (BATCH, SEQ + 1) int32 token batches (inputs and labels shifted by one; 0 is the pad
    token)."""
    import numpy as np

    rng = np.random.RandomState(SEED)
    return [rng.randint(1, VOCAB, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(steps)]


def image_batches(steps: int) -> list:
    """``steps`` (images, labels) pairs: BATCH float32 NCHW images of IMAGE x IMAGE pixels in [0, 1)
    and int32 labels below CLASSES."""
    import numpy as np

    rng = np.random.RandomState(SEED)
    return [(rng.rand(BATCH, 3, IMAGE, IMAGE).astype(np.float32),
             rng.randint(0, CLASSES, (BATCH,)).astype(np.int32)) for _ in range(steps)]


def images(batch) -> tuple:
    """The network's arguments: images and labels (``nn.WithLossCell`` takes both)."""
    import mindspore as ms

    return ms.Tensor(batch[0]), ms.Tensor(batch[1])


def with_loss(backbone):
    """A mindcv classifier trained as its own scripts do: cross-entropy over its logits."""
    import mindspore as ms

    return ms.nn.WithLossCell(backbone, ms.nn.CrossEntropyLoss())


def vit():
    """mindcv's ``VisionTransformer``: patch embedding (a strided Conv2d), a class token and position
    embedding Parameters added in ``construct``, pre-norm attention blocks with LayerNorm and GELU."""
    from mindcv.models.vit import VisionTransformer

    return with_loss(VisionTransformer(image_size=IMAGE, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                       num_classes=CLASSES))


def mobilenet():
    """mindcv's ``mobilenet_v3_small_075``: depthwise convolutions, squeeze-and-excitation, hard-swish,
    and BatchNorm, whose moving statistics (Parameters) the forward pass updates in training."""
    from mindcv.models import create_model

    return with_loss(create_model("mobilenet_v3_small_075", num_classes=CLASSES, pretrained=False))


class Model(NamedTuple):
    build: Callable[[], Any]        # the network, returning the loss
    batches: Callable[[int], list]  # steps -> one batch per step
    arguments: Callable[[Any], tuple]  # a batch -> the network's arguments
    package: str                    # the package whose code the census counts as model code


#: model name -> how it is built and fed
MODELS = {"llama": Model(llama, token_batches, whole, "mindformers"),
          "glm2": Model(glm2, token_batches, shifted, "mindformers"),
          "vit": Model(vit, image_batches, images, "mindcv"),
          "mobilenet": Model(mobilenet, image_batches, images, "mindcv")}


def build(optimizer: str, model: str):
    import mindspore as ms

    ms.set_seed(SEED)
    net = MODELS[model].build()
    net.set_train(True)
    params = net.trainable_params()
    if optimizer == "momentum":
        opt = ms.nn.Momentum(params, learning_rate=0.05, momentum=0.9)
    else:
        opt = ms.nn.AdamWeightDecay(params, learning_rate=1e-2, weight_decay=0.01)
    return net, opt


def _watched_attributes():
    """A few attributes the dump patches, to check that each run leaves them as it found them."""
    import mindspore as ms
    from mindspore import mint, ops
    from mindspore.ops import functional as F

    return {"ops.cast": (ops, "cast"), "F.cast": (F, "cast"), "F.shape": (F, "shape"),
            "mint.matmul": (mint, "matmul"), "Tensor.__add__": (ms.Tensor, "__add__"),
            "Tensor.reshape": (ms.Tensor, "reshape")}


def train(model: str, level: str, optimizer: str, task: str, steps: int, run_dir: str) -> dict:
    import mindspore as ms
    import numpy as np

    watched = _watched_attributes()
    before = {k: vars(o).get(a, getattr(o, a)) for k, (o, a) in watched.items()}
    result = {"run": os.path.basename(run_dir), "losses": [], "error": None, "seconds": []}
    net, opt = build(optimizer, model)
    arguments = MODELS[model].arguments
    debugger = None
    if level != "off":
        from msprobe.mindspore import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=os.path.join(run_dir, "dump"), task=task, level=level)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    names = [p.name for p in opt.parameters]
    try:
        for step, batch in enumerate(MODELS[model].batches(steps)):
            began = time.perf_counter()
            if debugger is not None:
                debugger.start(net)
            loss, grads = grad_fn(*arguments(batch))
            opt(grads)
            result["losses"].append(np.asarray(loss.asnumpy(), dtype=np.float32).tobytes().hex())
            np.savez(os.path.join(run_dir, f"grads_step{step}.npz"),
                     **{f"{i:03d}:{name}": g.asnumpy() for i, (name, g) in enumerate(zip(names, grads))})
            if debugger is not None:
                debugger.stop()
                debugger.step()
            result["seconds"].append(time.perf_counter() - began)
    except Exception as exc:  # the test compares this with the tool-off run
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        if debugger is not None:
            debugger.stop()
    ref = weakref.ref(net)
    del net, opt, grad_fn, debugger
    gc.collect()
    result["model_released"] = ref() is None
    if os.environ.get("THIRDPARTY_WORKER_REFERRERS") and ref() is not None:
        for holder in gc.get_referrers(ref()):
            print("held by", type(holder), str(holder)[:200] if not isinstance(holder, dict) else list(holder)[:12])
    result["left_patched"] = sorted(k for k, (o, a) in watched.items()
                                    if vars(o).get(a, getattr(o, a)) is not before[k])
    return result


# ------------------------------------------------------------------------------------------ census
def _listed_apis():
    """``id(function) -> name`` for support_wrap_ops.yaml functions, ``name -> Tensor.name`` for
    Tensor methods, read from the yaml file itself (not through msprobe's resolver)."""
    import importlib

    import mindspore as ms
    import yaml

    path = os.path.join(HERE, "..", "..", "msprobe", "capture", "support_wrap_ops.yaml")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    functions, codes = {}, {}
    for key, module_name in (("ops", "mindspore.ops"), ("mint.ops", "mindspore.mint"),
                             ("mint.nn.functional", "mindspore.mint.nn.functional")):
        module = importlib.import_module(module_name)
        for name in data.get(key) or ():
            obj = getattr(module, name, None)
            if callable(obj) and not isinstance(obj, type):
                functions.setdefault(id(obj), name)
                code = getattr(obj, "__code__", None)
                if code is not None:
                    codes.setdefault(code, set()).add(name)
    tensor_methods = {name for name in data.get("tensor") or () if hasattr(ms.Tensor, name)}
    return codes, tensor_methods


def census(model: str, out: str) -> None:
    """One tool-off training step with every sub-Cell call and every call from model code counted."""
    import mindspore as ms
    from mindspore.ops import Primitive

    net, opt = build("momentum", model)
    cells = {id(cell): (name, type(cell).__name__) for name, cell in net.cells_and_names() if name}
    model_cells = {id(cell) for _, cell in net.cells_and_names()}
    package = MODELS[model].package
    held = {}  # id(Primitive) -> (attribute, class name), as the Cells hold them
    for _, cell in net.cells_and_names():
        for attr, value in vars(cell).items():
            if isinstance(value, Primitive):
                held.setdefault(id(value), (attr, type(value).__name__))
    codes, tensor_methods = _listed_apis()
    cell_calls = collections.Counter()
    callers = collections.defaultdict(set)  # Cell key -> keys of the Cells whose construct called it
    keys = {id(cell): f"{name}.{type(cell).__name__}" for name, cell in net.cells_and_names() if name}

    def entered(key) -> None:
        cell_calls.update([key])
        frame = sys._getframe(1)
        while frame is not None and not (frame.f_code.co_name == "construct" and
                                         id(frame.f_locals.get("self")) in model_cells):
            frame = frame.f_back
        callers[key].add(None if frame is None else keys.get(id(frame.f_locals["self"])))

    for name, cell in net.cells_and_names():
        if name:
            cell.register_forward_pre_hook(lambda c, args, key=keys[id(cell)]: entered(key))
    listed, primitives, other = collections.Counter(), collections.Counter(), collections.Counter()
    created = collections.Counter()

    def is_model_frame(frame) -> bool:
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith(package):
            return True
        return id(frame.f_locals.get("self")) in model_cells and frame.f_code.co_name == "construct"

    def profile(frame, event, arg):
        if event == "call":
            caller = frame.f_back
            module = str(frame.f_globals.get("__name__", ""))
            if not module.startswith("mindspore") or not is_model_frame(caller):
                return
            code = frame.f_code
            me = frame.f_locals.get("self")
            where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
            if code.co_name in ("__init__", "deco") and isinstance(me, Primitive):
                created[f"{type(me).__name__} ({where})"] += 1  # a Primitive made during the step
            elif code.co_name == "__call__" and isinstance(me, Primitive):
                if id(me) in held:
                    primitives[f"Primitive.{type(me).__name__}"] += 1
                else:
                    other[f"unheld Primitive {type(me).__name__} ({where})"] += 1
            elif code in codes:
                names = codes[code]
                listed[sorted(names)[0] if len(names) == 1 else "|".join(sorted(names))] += 1
            elif code.co_filename.endswith(os.path.join("common", "tensor.py")) and \
                    code.co_name in tensor_methods and isinstance(me, ms.Tensor):
                listed[f"Tensor.{code.co_name}"] += 1
            else:
                other[f"{module}.{code.co_qualname}"] += 1
        elif event == "c_call" and is_model_frame(frame):
            owner = getattr(arg, "__self__", None)
            name = getattr(arg, "__name__", "")
            if isinstance(owner, ms.Tensor) and name in tensor_methods:
                listed[f"Tensor.{name}"] += 1

    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    arguments = MODELS[model].arguments(MODELS[model].batches(1)[0])
    sys.setprofile(profile)
    try:
        loss, grads = grad_fn(*arguments)
    finally:
        sys.setprofile(None)
    opt(grads)
    with open(os.path.join(out, "census.json"), "w", encoding="utf-8") as f:
        json.dump({"cells": cell_calls, "callers": {k: sorted(v, key=str) for k, v in callers.items()},
                   "listed": listed, "primitives": primitives, "other": other,
                   "created_primitives": created,
                   "parameters": len(opt.parameters), "loss": float(loss.asnumpy())}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["pynative", "graph"])
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--census", action="store_true")
    args = ap.parse_args()
    # a hang shows where, then ends the run. A GRAPH_MODE mindformers worker needs ~60 s of CPU, and
    # 590-600 s on the shared 2-core machine at load average ~20 (2026-12-03)
    faulthandler.dump_traceback_later(900, exit=True)
    runs = [parse_run(spec) for spec in args.runs]
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.chdir(out)  # importing mindformers writes ./output/log

    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    if MODELS[args.model].package == "mindformers":
        import mindformers  # noqa: F401  (logs its INFO lines once, here)

    if args.census:
        census(args.model, out)
    for level, optimizer, task in runs:
        run_dir = os.path.join(out, f"{level}-{optimizer}-{task}")
        os.makedirs(run_dir, exist_ok=True)
        result = train(args.model, level, optimizer, task, args.steps, run_dir)
        with open(os.path.join(run_dir, "result.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"{args.mode} {args.model} {result['run']}: "
              f"{'ok' if result['error'] is None else result['error']} ({sum(result['seconds']):.1f} s)",
              flush=True)


if __name__ == "__main__":
    main()
