"""gpulab.grading.lab04 (lab 04's graders): the solutions' values equal the references' on random
inputs, and the usual mistakes (a detached scatter, deep copies for replicas, a measurement that
forgets the parameters, a data_parallel that is not built from the student's pieces or gathers on
the wrong device) give other values."""

from __future__ import annotations

import copy
import random
import threading

import pytest
import torch
import torch.nn.functional as F

from gpulab.autograde.box.mask import masked_names, write_masks
from gpulab.devices import MemoryMeter, logical_devices
from gpulab.evidence.codec import encode
from gpulab.grading import lab04
from gpulab.parallel import DataParallel, comm
from gpulab.parallel.dp.data_parallel import data_parallel as gpulab_data_parallel
from gpulab.parallel.dp.parallel_apply import parallel_apply as gpulab_parallel_apply
from gpulab.parallel.dp.replicate import replicate as gpulab_replicate
from gpulab.verdict.check import decode, verdict


@pytest.fixture(scope="module")
def devices():
    return logical_devices(4)


def close(actual, expected, rtol=None) -> bool:
    """What the grader decides for check_close (values encoded and decoded as evidence)."""
    return verdict({"kind": "close", "what": "x", "rtol": rtol}, decode(encode(actual)), decode(encode(expected))) is None


# the lab's solutions
def scatter(batch, devices):
    if batch.shape[0] == 0:
        raise ValueError("0 rows")
    return [comm.to(piece, dev) for piece, dev in zip(batch.chunk(len(devices)), devices)]


def gather(outputs, device):
    return torch.cat([comm.to(out, device) for out in outputs], dim=0)


def replicate(model, devices):
    modules = list(model.modules())
    weights = {id(p): [comm.to(p, d) for d in devices] for p in model.parameters()}
    with torch.no_grad():
        states = {id(b): [comm.to(b, d) for d in devices] for b in model.buffers()}
    replicas = []
    for j in range(len(devices)):
        copies = {id(m): m._replicate_for_data_parallel() for m in modules}
        for m in modules:
            r = copies[id(m)]
            for name, child in m._modules.items():
                r._modules[name] = None if child is None else copies[id(child)]
            for name, p in m._parameters.items():
                setattr(r, name, None if p is None else weights[id(p)][j])
            for name, b in m._buffers.items():
                r._buffers[name] = None if b is None else states[id(b)][j]
        replicas.append(copies[id(model)])
    return replicas


def parallel_apply(replicas, pieces, devices):
    outputs, errors = [None] * len(replicas), [None] * len(replicas)

    def work(i):
        try:
            with devices[i]:
                outputs[i] = replicas[i](pieces[i])
        except Exception as err:
            errors[i] = err

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, err in enumerate(errors):
        if err is not None:
            raise RuntimeError(f"in replica {i}") from err
    return outputs


def data_parallel(model, batch, devices, output_device=None):
    pieces = scatter(batch, devices)
    used = devices[:len(pieces)]
    return gather(parallel_apply(replicate(model, used), pieces, used), output_device or devices[0])


def step_peaks(model, inputs, targets, devices):
    model.zero_grad(set_to_none=True)
    meter = MemoryMeter(devices=devices)
    meter.track(model, devices[0])
    with meter:
        out = model(inputs)
        F.cross_entropy(out, comm.to(targets, model.output_device)).backward()
        del out
    model.zero_grad(set_to_none=True)
    return [meter.peak(d) for d in devices]


def test_where_names_the_device_without_its_simulated_flag(devices) -> None:
    x = comm.to(torch.ones(2), devices[2])
    assert lab04.where(x) == "logical:2 on cpu" == lab04.where(devices[2])
    assert lab04.where([devices[0], x]) == ["logical:0 on cpu", "logical:2 on cpu"]


@pytest.mark.parametrize("seed", range(3))
def test_scatter_and_gather_facts_agree_with_comm(devices, seed) -> None:
    rng = random.Random(seed)
    cases = lab04.scatter_cases(rng, 16)
    assert close(lab04.scatter_facts(scatter, devices, cases, seed), lab04.scatter_facts(comm.scatter, devices, cases, seed))

    def detached(batch, devs):
        return [comm.to(p, d) for p, d in zip(batch.detach().chunk(len(devs)), devs)]

    def no_move(batch, devs):
        return list(batch.chunk(len(devs)))

    with pytest.raises(RuntimeError):
        lab04.scatter_facts(detached, devices, cases, seed)
    assert not close(lab04.scatter_facts(no_move, devices, cases, seed),
                     lab04.scatter_facts(comm.scatter, devices, cases, seed))
    cases = lab04.gather_cases(rng, 8)
    assert close(lab04.gather_facts(gather, devices, cases, seed), lab04.gather_facts(comm.gather, devices, cases, seed))

    def reversed_gather(outs, device):
        return gather(outs[::-1], device)

    many = [([2, 3], 2, 1)] + cases
    assert not close(lab04.gather_facts(reversed_gather, devices, many, seed),
                     lab04.gather_facts(comm.gather, devices, many, seed))


def test_replicate_graders_pass_the_solution_and_fail_deep_copies(devices) -> None:
    for rows in (1, 6, 13):
        assert close(lab04.train_steps(replicate, devices, [5, 9, 3], rows, 3, rows),
                     lab04.single_steps(devices, [5, 9, 3], rows, 3, rows))

    def deep(model, devs):
        return [copy.deepcopy(model) for _ in devs]

    assert not close(lab04.train_steps(deep, devices, [5, 9, 3], 8, 3, 1), lab04.single_steps(devices, [5, 9, 3], 8, 3, 1))
    tied = lab04.tied_facts(gpulab_replicate, devices, 3, 5, 7, 2)
    assert tied["each replica's first and last layers share one weight"] == [True] * 3
    assert close(lab04.tied_facts(replicate, devices, 3, 5, 7, 2), tied)
    assert close(lab04.eval_outputs(replicate, devices, [4, 8, 3], 5), lab04.eval_outputs(gpulab_replicate, devices, [4, 8, 3], 5))


def test_apply_outputs_and_data_parallel_gradients(devices) -> None:
    assert close(lab04.apply_outputs(parallel_apply, gpulab_replicate, devices[:3], [4, 6, 2], 7, 3),
                 lab04.apply_outputs(gpulab_parallel_apply, gpulab_replicate, devices[:3], [4, 6, 2], 7, 3))
    for rows, out in [(1, None), (5, devices[2]), (13, devices[0])]:
        assert close(lab04.dp_gradients(data_parallel, devices, rows, out, rows), lab04.single_gradients(devices, rows, rows))


def test_calls_made_counts_the_notebooks_own_functions(devices) -> None:
    namespace = {"scatter": scatter, "replicate": replicate, "parallel_apply": parallel_apply, "gather": gather}

    def mine(model, batch, devs, output_device=None):  # looks its pieces up in `namespace`, as a notebook does
        pieces = namespace["scatter"](batch, devs)
        used = devs[:len(pieces)]
        outs = namespace["parallel_apply"](namespace["replicate"](model, used), pieces, used)
        return namespace["gather"](outs, output_device or devs[0])

    names = tuple(namespace)
    assert lab04.calls_made(namespace, names, lambda: lab04.dp_gradients(mine, devices, 6, None, 0)) == dict.fromkeys(names, 1)
    assert namespace["scatter"] is scatter  # put back

    def torchs(model, batch, devs, output_device=None):
        return DataParallel(model, devs, output_device)(batch)

    assert lab04.calls_made(namespace, names, lambda: lab04.dp_gradients(torchs, devices, 6, None, 0)) == dict.fromkeys(names, 0)


def test_measured_peaks_agree_with_gpulabs_and_catch_an_untracked_model(devices) -> None:
    head, x, y = lab04.head_batch(64, devices)
    model = DataParallel(head, devices, output_device=devices[2])
    want = lab04.measured(lab04.reference_peaks, model, x, y, devices)
    assert want["parameters left with a gradient"] == [False] * len(list(head.parameters()))
    peaks = want["peak bytes per device"]
    assert min(peaks[0], peaks[2]) > max(peaks[1], peaks[3])  # the parameters' home and the output device
    assert close(lab04.measured(step_peaks, model, x, y, devices), want, rtol=0.05)

    def untracked(model, inputs, targets, devs):
        meter = MemoryMeter(devices=devs)
        with meter:
            F.cross_entropy(model(inputs), comm.to(targets, model.output_device)).backward()
        return [meter.peak(d) for d in devs]

    assert not close(lab04.measured(untracked, model, x, y, devices), want, rtol=0.05)


def test_step_peaks_is_graded_on_the_students_data_parallel(devices) -> None:
    """The hidden test of step_peaks measures the student's data_parallel: the lab's solution (and a
    gather through one output buffer, as comm.gather copies) matches gpulab's measurement of gpulab's
    DataParallel at every batch it may draw; one that gathers on the wrong device does not."""
    cases = list(zip(lab04.PEAK_BATCHES, [None, 1, 2, 3, None, 1]))
    want = lab04.dp_peaks(lab04.reference_peaks, gpulab_data_parallel, devices, cases)
    assert close(lab04.dp_peaks(step_peaks, data_parallel, devices, cases), want, rtol=0.05)

    def one_buffer(model, batch, devs, output_device=None):
        pieces = scatter(batch, devs)
        used = devs[:len(pieces)]
        return comm.gather(parallel_apply(replicate(model, used), pieces, used), output_device or devs[0])

    assert close(lab04.dp_peaks(step_peaks, one_buffer, devices, cases[:3]), lab04.dp_peaks(
        lab04.reference_peaks, gpulab_data_parallel, devices, cases[:3]), rtol=0.05)
    rng = random.Random(4)
    drawn = [lab04.peak_cases(rng) for _ in range(20)]
    assert all(b in lab04.PEAK_BATCHES for c in drawn for b, _ in c)
    assert [out for c in drawn for _, out in c[:1]] == [None] * 20 and {c[1][1] for c in drawn} == {1, 2, 3}

    def ignores_output_device(model, batch, devs, output_device=None):
        return data_parallel(model, batch, devs)

    def gathers_on_the_last(model, batch, devs, output_device=None):
        return data_parallel(model, batch, devs, devs[-1])

    moved = [(128, 2)]
    mine = lab04.dp_peaks(step_peaks, ignores_output_device, devices, moved)
    assert not close(mine, lab04.dp_peaks(lab04.reference_peaks, gpulab_data_parallel, devices, moved), rtol=0.05)
    peaks = mine["batch 128, output_device=devices[2]"]["peak bytes per device"]
    assert peaks.index(max(peaks)) == 0  # the visible check (heaviest device follows output_device) fails too
    default = [(96, None)]
    assert not close(lab04.dp_peaks(step_peaks, gathers_on_the_last, devices, default),
                     lab04.dp_peaks(lab04.reference_peaks, gpulab_data_parallel, devices, default), rtol=0.05)


def test_the_reference_is_step_memory_and_can_be_masked(tmp_path) -> None:
    assert masked_names(lab04.REFERENCES) == ["gpulab.parallel.dp.step_memory.step_memory"]
    masked = {original.name: copy.read_text() for copy, original in write_masks(lab04.REFERENCES, tmp_path)
              if copy.suffix == ".py"}
    assert set(masked) == {"step_memory.py"}
    assert "class HeadWorkload" in masked["step_memory.py"] and "def largest_batch" in masked["step_memory.py"]
