"""The one grammar of entry, counter and file names (msprobe.format.naming; seed: "dump结果文件说明")."""
from __future__ import annotations

import pytest

from msprobe.format import naming


def test_api_and_cell_entries():
    assert naming.api_entry("Functional.relu", 3, naming.FORWARD) == "Functional.relu.3.forward"
    prefix = naming.cell_prefix("layer.0.fc", "Dense")
    assert prefix == "Cell.layer.0.fc.Dense"
    assert naming.cell_prefix("fc", "Dense", index=1) == "Cell.1.fc.Dense"
    assert naming.cell_entry(prefix, naming.BACKWARD, 2) == "Cell.layer.0.fc.Dense.backward.2"
    assert naming.cell_counter(prefix) == "Cell.layer.0.fc.Dense.forward"


@pytest.mark.parametrize("forward,backward", [
    ("Functional.relu.3.forward", "Functional.relu.3.backward"),
    ("Cell.layer.0.fc.Dense.forward.2", "Cell.layer.0.fc.Dense.backward.2"),
    # a Cell path segment that happens to be called "backward" is not the direction
    ("Cell.backward.Dense.forward.0", "Cell.backward.Dense.backward.0"),
])
def test_backward_and_forward_pair(forward, backward):
    assert naming.backward_of(forward) == backward
    assert naming.forward_of(backward) == forward
    assert naming.forward_of(forward) is None and naming.backward_of(backward) is None


@pytest.mark.parametrize("name", [None, "x.0.debug", "Cell.fc.Dense.parameters_grad.0", "relu"])
def test_other_names_have_no_direction_pair(name):
    assert naming.forward_of(name) is None and naming.backward_of(name) is None


def test_parameter_gradient_entries():
    prefix = naming.cell_prefix("fc", "Dense")
    entry = naming.param_grad_entry(prefix, 2)
    assert entry == "Cell.fc.Dense.parameters_grad.2"
    assert naming.param_grad_counter(prefix) == "Cell.fc.Dense.parameters_grad"
    assert naming.param_grad_calls(entry) == ("Cell.fc.Dense.forward.2", "Cell.fc.Dense.backward.2")
    assert naming.param_grad_calls("Cell.fc.Dense.backward.2") is None
    assert naming.param_grad_calls("Cell.fc.Dense.parameters_grad") is None


def test_debug_entries():
    assert naming.debug_counter("h") == "h.debug"
    assert naming.debug_entry("h", 1) == "h.1.debug"
    assert naming.debug_grad_entry("h", 1) == "h_grad.1.debug"


def test_item_names_and_data_files():
    assert naming.item_name("h_grad.0.debug", 1, 0) == "h_grad.0.debug.1.0"
    assert naming.item_name("Functional.relu.0.forward") == "Functional.relu.0.forward"
    assert naming.data_file_name("Functional.split.0.forward", "input", (0,)) == \
        "Functional.split.0.forward.input.0.npy"
    assert naming.data_file_name("h.0.debug", "", ("a", 1)) == "h.0.debug.a.1.npy"


def test_long_file_names_are_shortened_and_unique():
    entry = "Cell." + "a" * 300 + ".Dense.forward.0"
    one = naming.data_file_name(entry, "output", (0,))
    two = naming.data_file_name(entry, "output", (1,))
    assert one != two and one.endswith(".npy")
    assert len(one.encode()) <= naming.MAX_FILE_NAME_BYTES and len(two.encode()) <= naming.MAX_FILE_NAME_BYTES


@pytest.mark.parametrize("entry,key,direction", [
    ("Functional.relu.3.forward", "Functional.relu.forward", "forward"),
    ("Tensor.__add__.0.backward", "Tensor.__add__.backward", "backward"),
    ("Cell.layer.0.fc.Dense.forward.2", "Cell.Dense.forward", "forward"),
    ("Cell.1.fc.Dense.backward.0", "Cell.Dense.backward", "backward"),
    ("Cell.fc.Dense.parameters_grad.0", "Cell.Dense.parameters_grad", "backward"),
    ("h.1.debug", "h.debug", "forward"),
    ("h_grad.1.debug", "h_grad.debug", "backward"),
    ("not_a_dump_name", "not_a_dump_name", "forward"),
])
def test_api_key_and_direction_parse_every_kind_of_entry(entry, key, direction):
    assert naming.api_key(entry) == key
    assert naming.direction_of(entry) == direction


def test_entry_kinds():
    assert naming.is_param_grad("Cell.fc.Dense.parameters_grad.0")
    assert naming.is_param_grad("Cell.fc.Dense.parameters_grad")   # the reference tool's name
    assert not naming.is_param_grad("Cell.fc.Dense.backward.0")
    assert naming.is_debug("h_grad.0.debug") and not naming.is_debug("Functional.relu.0.forward")
