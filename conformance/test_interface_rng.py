"""Random number generation on the XLA device (DeepSpeedAccelerator RNG APIs).

DeepSpeed's activation checkpointing saves get_rng_state() before a forward and restores it with
default_generator(idx).set_state(...) to replay dropout in the recomputation: a state must
capture and restore the XLA device's draws, not the host's.
"""

import pytest
import torch

from conformance_helpers import INDEX_FORMS, host, materialise

pytestmark = pytest.mark.area("interface")


def _draws(device):
    return host(torch.rand(8, device=device)).tolist()


def test_get_rng_state(accel, xla_device, evidence):
    state = accel.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8, (
        f"get_rng_state() returned {type(state).__name__} {getattr(state, 'dtype', '')}; DeepSpeed stores it as "
        "a ByteTensor (torch.uint8)")
    first = _draws(xla_device)
    accel.set_rng_state(state)
    replay = _draws(xla_device)
    evidence.update(first=first, after_restore=replay)
    assert replay == first, ("restoring get_rng_state() did not replay the XLA device's random draws: the state "
                             "must capture the device generator (activation checkpointing replays dropout with it)")


def test_get_rng_state__reading_leaves_the_generator_alone(accel, xla_device, evidence):
    """DeepSpeed reads the state at every checkpointed forward and backward; reading must not move
    the generator (on XLA it would replay the step's earlier dropout masks)."""
    accel.manual_seed(11)
    _draws(xla_device)
    unread = _draws(xla_device)
    accel.manual_seed(11)
    _draws(xla_device)
    accel.get_rng_state()
    after_read = _draws(xla_device)
    evidence.update(unread=unread, after_read=after_read)
    assert after_read == unread, "get_rng_state() moved the XLA generator: the draws after it differ from a run " \
                                 "that did not read the state"


@pytest.mark.parametrize("form", [None, *INDEX_FORMS])
def test_set_rng_state(accel, xla_device, form):
    index = None if form is None else INDEX_FORMS[form](0)
    state = accel.get_rng_state(index)
    first = _draws(xla_device)
    _draws(xla_device)  # move the generator further on
    accel.set_rng_state(state, index)
    assert _draws(xla_device) == first, (f"set_rng_state(state, {index!r}) did not return the XLA generator to the "
                                         "state taken by get_rng_state")


def _next_step_draws(accel, device, mid_step):
    accel.manual_seed(5)
    _draws(device)
    mid_step()
    materialise()  # the step ends
    return _draws(device)


def test_set_rng_state__mid_step_keeps_later_steps(accel, xla_device, evidence):
    # Activation checkpointing restores RNG states in the middle of every step (to replay dropout, then
    # to go back): the steps after it must draw what they would have drawn without the recomputation.
    plain = _next_step_draws(accel, xla_device, lambda: None)
    restored = _next_step_draws(accel, xla_device, lambda: accel.set_rng_state(accel.get_rng_state()))
    evidence.update(next_step_plain=plain, next_step_after_mid_step_restore=restored)
    assert restored == plain, ("a get_rng_state/set_rng_state round trip in the middle of a step changed the next "
                               "step's draws: activation checkpointing with dropout would change the training run")


def test_set_rng_state__host_generator_untouched(accel, xla_device):
    host_state = torch.get_rng_state()
    accel.set_rng_state(accel.get_rng_state())
    _draws(xla_device)
    assert torch.equal(torch.get_rng_state(), host_state), ("set_rng_state or XLA draws changed the host (CPU) "
                                                            "generator; DeepSpeed saves and restores it separately")


@pytest.mark.parametrize("form", INDEX_FORMS)
def test_default_generator(accel, xla_device, form):
    generator = accel.default_generator(INDEX_FORMS[form](0))
    for name in ("get_state", "set_state", "manual_seed", "initial_seed"):
        assert callable(getattr(generator, name, None)), f"default_generator({form}) has no {name}()"
    # Activation checkpointing's _set_cuda_rng_state: default_generator(idx).set_state(get_rng_state()).
    state = accel.get_rng_state()
    first = _draws(xla_device)
    generator.set_state(state)
    assert _draws(xla_device) == first, ("default_generator(idx).set_state(get_rng_state()) did not replay the XLA "
                                         "draws; DeepSpeed restores RNG state exactly this way")
    assert torch.equal(generator.get_state(), accel.get_rng_state()), (
        "default_generator(idx).get_state() differs from get_rng_state(idx)")


def test_manual_seed(accel, xla_device, evidence):
    accel.manual_seed(1234)
    first = _draws(xla_device)
    accel.manual_seed(1234)
    second = _draws(xla_device)
    accel.manual_seed(4321)
    other = _draws(xla_device)
    evidence.update(seed_1234=first, seed_1234_again=second, seed_4321=other)
    assert first == second, "manual_seed(s) twice gave different XLA draws: seeding must make device draws reproducible"
    assert first != other, "manual_seed with different seeds gave identical XLA draws: the seed is not used"


def test_manual_seed__host_generator_untouched(accel):
    # As torch.cuda.manual_seed: activation checkpointing seeds the device per model-parallel rank
    # (model_parallel_cuda_manual_seed) and leaves host randomness alike on every rank.
    host_state = torch.get_rng_state()
    accel.manual_seed(99)
    assert torch.equal(torch.get_rng_state(), host_state), (
        "manual_seed changed the host (CPU) generator; DeepSpeed seeds only the device through it")


def test_manual_seed_all(accel, xla_device):
    accel.manual_seed_all(77)
    first = _draws(xla_device)
    accel.manual_seed_all(77)
    assert _draws(xla_device) == first, "manual_seed_all(s) twice gave different XLA draws"


def test_initial_seed(accel):
    accel.manual_seed(2024)
    seed = accel.initial_seed()
    assert isinstance(seed, int) and seed == 2024, f"after manual_seed(2024), initial_seed() returned {seed!r}"


def test_random(accel):
    module = accel.random()
    for name in ("manual_seed", "seed", "get_rng_state", "set_rng_state", "initial_seed", "fork_rng"):
        assert callable(getattr(module, name, None)), f"random() returned {module!r}, which has no {name}()"


def test_get_rng_state__deepspeed_rng_tracker(accel, xla_device, evidence):
    """Model-parallel RNG tracker (activation checkpointing): fork() draws from a tracked state and
    leaves the default stream of draws as if it had not happened."""
    from deepspeed.runtime.activation_checkpointing.checkpointing import CudaRNGStatesTracker

    accel.manual_seed(5)
    without_fork = _draws(xla_device)

    accel.manual_seed(5)
    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 999)
    with tracker.fork("model-parallel-rng"):
        forked = _draws(xla_device)
    after_fork = _draws(xla_device)

    accel.manual_seed(999)
    seeded_999 = _draws(xla_device)
    evidence.update(forked=forked, seeded_999=seeded_999, default=without_fork, after_fork=after_fork)
    assert forked == seeded_999, "draws inside tracker.fork() do not follow the tracked seed"
    assert after_fork == without_fork, "tracker.fork() changed the XLA draws outside the fork"


def test_lazy_call(accel, xla_device):
    """Activation checkpointing restores RNG state through lazy_call(cb); the callback must have
    run by the time the next draw happens."""
    from deepspeed.runtime.activation_checkpointing.checkpointing import _set_cuda_rng_state

    calls = []
    accel.lazy_call(lambda: calls.append("ran"))
    accel.synchronize()
    assert calls == ["ran"], "lazy_call(callback) never ran the callback"
    state = accel.get_rng_state()
    first = _draws(xla_device)
    _set_cuda_rng_state(state)
    assert _draws(xla_device) == first, "RNG state restored through lazy_call did not apply before the next draw"
