"""event_store.collector.CollectorPaced: the services' garbage collections paced between batches."""
import gc
import weakref

from event_store.collector import THRESHOLDS, CollectorPaced


class Node:
    def __init__(self):
        self.other = None


def cycle() -> weakref.ref:
    """A reference cycle nobody references, and a weak reference to one of its objects."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_tick_collects_the_cycles_dropped_since_the_last_one_and_leaves_the_state_out_of_later_collections():
    before = gc.get_threshold()
    with CollectorPaced(every_s=0) as collector:
        state = [Node() for _ in range(200_000)]  # a service's long-lived state
        dropped = cycle()
        assert dropped() is not None
        collector.tick()
        assert dropped() is None, "a cycle dropped between ticks must be collected at the next one"
        # The state survived the tick: frozen, so no later collection visits it (each visits what is newer).
        assert len(gc.get_objects()) < 50_000 and gc.get_freeze_count() >= len(state)
        assert gc.get_threshold() == THRESHOLDS
        more = [Node() for _ in range(1_000)]
        dropped = cycle()
        collector.tick()
        assert dropped() is None and collector.collections == 2 and len(gc.get_objects()) < 50_000
        del state, more
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_ticks_are_paced():
    with CollectorPaced(every_s=3600) as collector:
        dropped = cycle()
        collector.tick()
        assert collector.collections == 0 and dropped() is not None  # not yet: the last one was on entry
    gc.collect()
    assert dropped() is None


def test_loops_side_by_side_in_one_process_hand_back_the_collector_when_the_last_one_ends():
    before = gc.get_threshold()
    with CollectorPaced(every_s=0) as outer:
        with CollectorPaced(every_s=0) as inner:
            inner.tick()
        assert gc.get_threshold() == THRESHOLDS  # the outer loop still runs
        kept = [Node() for _ in range(10_000)]
        outer.tick()
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_cycle_frozen_while_referenced_is_collected_by_the_next_whole_collection():
    # A loop whose libraries make cycles that outlive a tick (the projection's) collects everything now and then.
    for whole_every_s, collected in ((None, False), (0, True)):
        with CollectorPaced(every_s=0, whole_every_s=whole_every_s) as collector:
            a, b = Node(), Node()
            a.other, b.other = b, a
            held = weakref.ref(a)
            collector.tick()  # still referenced: it survives, frozen
            del a, b
            collector.tick()
            assert (held() is None) == collected
        gc.collect()
        assert held() is None  # handed back to the collector on exit
