"""Flush: turns pending tensor slots into finished leaf records (statistics layer entry point).

This is the only place that reads tensor data. It runs at flush points (batch full, before an in-place
operation, ``stop()``, ``step()``, exit), never per hooked call: a batch synchronises the device
once, then on CPU reads every tensor as a zero-copy view of its memory.
"""
from __future__ import annotations

import os

from msprobe.core import stats


def materialize(slots, *, md5: bool, tensor_dir: str | None, on_error) -> None:
    """Fill ``slot.leaf`` for every slot (statistics, optional CRC-32, optional ``.npy`` file).

    Args:
        slots: iterable of :class:`msprobe.core.records.TensorSlot`.
        md5: add ``"md5"``: CRC-32 of the tensor bytes as 8 hex digits (spec §4.7).
        tensor_dir: directory for ``.npy`` files of slots with a ``data_name``.
        on_error: ``callable(str)`` told about a tensor that could not be read; its leaf then has
            null statistics and an ``"error"`` field. Never raises for bad tensors.
    """
    # The same tensor object often appears several times in one batch (an API's output is the next
    # API's input). Nothing can change it within a batch (the mutation guard flushes before in-place
    # ops; Parameters are snapshots), so it is read and reduced once. Keyed by id(): the slots keep
    # every tensor alive until the batch is done, so ids are not reused meanwhile.
    seen: dict = {}
    zero_copy = any(slot.type_name != "numpy.ndarray" for slot in slots) and stats.host_memory_readable()
    for slot in slots:
        if slot.leaf is not None:
            continue
        leaf = {"type": slot.type_name, "dtype": slot.dtype, "shape": slot.shape}
        try:
            known = seen.get(id(slot.tensor))
            if known is None:
                if slot.type_name == "numpy.ndarray":
                    arr, stored = slot.tensor, "native"
                else:
                    arr, stored = stats.to_host(slot.tensor, zero_copy)
                known = seen[id(slot.tensor)] = (arr, stored, stats.compute_stats(arr), [])
            arr, stored, tensor_stats, crc = known
            leaf.update(tensor_stats)
            if slot.data_name and tensor_dir:
                stats.save_npy(os.path.join(tensor_dir, slot.data_name), arr)
                leaf["data_name"] = slot.data_name
                if stored != "native":
                    leaf["stored_as"] = stored
            if md5:
                if not crc:
                    crc.append(stats.crc32_hex(arr))
                leaf["md5"] = crc[0]
        except OSError:  # the disk is full or not writable: the runtime switches the dump off
            if slot.data_name and tensor_dir:  # no truncated .npy left behind
                try:
                    os.remove(os.path.join(tensor_dir, slot.data_name))
                except OSError:
                    pass
            raise
        except Exception as exc:  # a bad tensor must not break the training step
            leaf.update({"Max": None, "Min": None, "Mean": None, "Norm": None, "error": repr(exc)})
            on_error(f"could not read tensor for {slot.data_name or slot.dtype}: {exc!r}")
        slot.leaf = leaf
    for slot in slots:  # release the tensors only now: ids must stay unique while ``seen`` is used
        slot.tensor = None
