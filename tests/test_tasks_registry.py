"""The task registry: an explicit table of names, each a Task of that name; an unknown name lists the choices."""

from __future__ import annotations

import pytest

from birder_repro.run.schema import declared_metrics
from birder_repro.tasks import TASKS, Task, UnknownTask, declared_metrics_of, get_task, list_tasks


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_name_gives_a_task_of_that_name(name):
    task = get_task(name)
    assert isinstance(task, Task) and task.name == name


def test_an_unknown_task_fails_listing_the_tasks():
    with pytest.raises(UnknownTask) as err:
        get_task("resnet18")
    assert "resnet18" in str(err.value) and all(name in str(err.value) for name in list_tasks())


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_entry_says_what_its_class_declares(name):
    """The CLI checks a target's metric and looks for a dataset from the entry alone (no task module imported):
    the entry must say what the class does."""
    task, entry = get_task(name), TASKS[name]
    assert entry.metrics == declared_metrics(task)
    assert entry.checks_data == (type(task).check_data is not Task.check_data)
    assert declared_metrics_of(name) == entry.metrics


def test_the_torch_free_data_checks_are_the_registrys_and_each_tasks_own(compose, tmp_path):
    """tasks.data_files.CHECKS holds a check for exactly the tasks that look for a dataset, and each task's own
    check_data (what a user's script calls) refuses an empty data.root with the same message as the CLI's."""
    from torchvision.datasets import CIFAR100

    from birder_repro.tasks import DatasetNotFound, check_data
    from birder_repro.tasks.data_files import CHECKS, CIFAR100_FOLDER

    assert set(CHECKS) == {name for name, entry in TASKS.items() if entry.checks_data}
    assert CIFAR100_FOLDER == CIFAR100.base_folder
    for name in sorted(CHECKS):
        cfg = compose([f"task={name}", f"data.root={tmp_path / 'empty'}"])
        with pytest.raises(DatasetNotFound) as by_cli:
            check_data(cfg)
        with pytest.raises(DatasetNotFound) as by_task:
            get_task(name).check_data(cfg)
        assert str(by_cli.value) == str(by_task.value) and str(tmp_path / "empty") in str(by_cli.value), name


def test_a_lazy_name_is_imported_on_first_use_and_an_unknown_one_is_an_attribute_error():
    import birder_repro.optim as optim
    from birder_repro.optim.birder import Birder

    assert optim.Birder is Birder  # imported from its module on first use
    with pytest.raises(AttributeError, match="'birder_repro.optim' has no attribute 'Birdr'"):
        optim.Birdr  # noqa: B018
