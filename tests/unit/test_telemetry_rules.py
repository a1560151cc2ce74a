"""The telemetry detector's rules as pure functions: each fires exactly where expected on a scripted stream and
nowhere else (a run of 2: nothing; a run of 5: one finding; late readings; silence just under and just over the
heartbeat; decommissioned: nothing)."""
from event_store.iot.telemetry_rules import (OUT_OF_RANGE_RUN, RULES, SILENT_DEVICE, Observation, TelemetryState,
                                             decode_state, detect, encode_state, flag_command_id, next_timer_ms,
                                             on_timer)

S = 1000  # ms
IN, OUT = 20_000, 60_000  # range 0 .. 50 000 milli


class Device:
    """One device's events, versions counted, through ``detect``; ``on_timer`` in between."""

    def __init__(self, at: int = 0, heartbeat_s: int = 60):
        self.state, self.version, self.findings = TelemetryState(), 0, []
        self._feed(Observation("DeviceRegistered", self._next(), at, range_min_milli=0, range_max_milli=50_000,
                               heartbeat_interval_s=heartbeat_s))

    def _next(self) -> int:
        self.version += 1
        return self.version

    def _feed(self, observation):
        self.state, found = detect(self.state, observation)
        self.findings += found
        return [(f.rule, f.reading_id) for f in found]

    def read(self, t_s: float, value: int, reading_id: str | None = None):
        return self._feed(Observation("ReadingRecorded", self._next(), int(t_s * S), reading_id or f"r{t_s:g}",
                                      value))

    def decommission(self, t_s: float):
        return self._feed(Observation("DeviceDecommissioned", self._next(), int(t_s * S)))

    def timer(self, now_ms: int):
        self.state, found = on_timer(self.state, now_ms)
        self.findings += found
        return [(f.rule, f.reading_id, f.time_ms, f.anchor) for f in found]


def test_a_run_of_two_flags_nothing_a_run_of_five_flags_once_at_its_third_reading():
    d = Device()
    assert d.read(10, OUT) == [] and d.read(20, OUT) == [] and d.read(30, IN) == []
    found = [d.read(t, OUT) for t in (40, 50, 60, 70, 80)]
    assert found == [[], [], [(OUT_OF_RANGE_RUN, "r60")], [], []]
    assert d.read(90, IN) == [] and d.read(100, OUT) == []
    assert [(f.rule, f.time_ms, f.anchor) for f in d.findings] == [(OUT_OF_RANGE_RUN, 60 * S, "r60")]
    assert "3 consecutive readings" in d.findings[0].evidence and "r40, r50, r60" in d.findings[0].evidence


def test_the_range_is_inclusive():
    d = Device()
    assert [d.read(t, v) for t, v in ((1, 0), (2, 50_000), (3, -1), (4, 50_001), (5, 0))] == [[]] * 5
    assert [d.read(t, v) for t, v in ((6, -1), (7, 50_001), (8, -10**9))] == [[], [], [(OUT_OF_RANGE_RUN, "r8")]]


def test_consecutive_means_in_measured_at_order_not_arrival_order():
    d = Device()
    # Three out-of-range readings arrive in a row, but an in-range one (20) was measured between them.
    assert d.read(20, IN) == [] and d.read(10, OUT) == [] and d.read(30, OUT) == [] and d.read(35, OUT) == []
    assert d.read(40, IN) == [] and d.findings == []
    # A late reading that completes a run (100, 120 out; 110 arrives last): one finding, anchored on it.
    assert d.read(100, OUT) == [] and d.read(120, OUT) == []
    assert d.read(110, OUT) == [(OUT_OF_RANGE_RUN, "r110")]
    assert d.findings[0].time_ms == 110 * S


def test_late_readings_joining_or_splitting_a_reported_run_flag_nothing():
    d = Device()
    assert [d.read(t, OUT) for t in (40, 50, 60)] == [[], [], [(OUT_OF_RANGE_RUN, "r60")]]
    assert d.read(90, IN) == []
    assert d.read(70, OUT) == [] and d.read(35, OUT) == []  # extend it on either side, late
    assert d.read(55, IN) == []  # split it: 35, 40, 50 | 60, 70 (both parts reported)
    assert d.read(65, OUT) == [] and d.read(45, OUT) == []
    assert len(d.findings) == 1


def test_a_late_reading_next_to_a_run_of_two_completes_it_however_far_apart_in_time():
    d = Device()
    assert [d.read(t, v) for t, v in ((200, OUT), (210, OUT), (230, IN))] == [[]] * 3
    assert d.read(190, OUT) == [(OUT_OF_RANGE_RUN, "r190")]  # 190, 200, 210
    # Consecutive readings, not consecutive seconds: the time between them does not matter (silence is rule 2).
    d = Device()
    assert [d.read(t, OUT) for t in (200, 1_000, 5_000)] == [[], [], [(OUT_OF_RANGE_RUN, "r5000")]]
    # Kept apart by an in-range reading, two runs of 2 stay two runs of 2.
    d = Device()
    assert [d.read(t, v) for t, v in ((200, OUT), (210, OUT), (220, IN), (230, OUT), (240, OUT))] == [[]] * 5
    assert d.findings == []


def test_a_replayed_event_changes_nothing():
    d = Device()
    for t in (10, 20, 30):
        d.read(t, OUT)
    state = d.state
    again, found = detect(state, Observation("ReadingRecorded", 3, 30 * S, "r30", OUT))
    assert (again, found) == (state, [])
    assert len(d.findings) == 1


def test_silence_just_under_and_just_over_the_heartbeat_fires_once():
    d = Device(heartbeat_s=60)
    assert d.read(10, IN, "a") == []
    assert next_timer_ms(d.state) == 70 * S + 1
    assert d.timer(70 * S) == []  # exactly 60 s: not more than the heartbeat
    assert d.timer(70 * S + 1) == [(SILENT_DEVICE, "a", 70 * S, f"since:{10 * S}")]
    assert d.timer(70 * S + 2) == [] and d.timer(10_000 * S) == []  # once per silence
    assert next_timer_ms(d.state) is None
    assert "after the reading a" in d.findings[0].evidence


def test_a_late_reading_from_inside_the_heartbeat_does_not_end_the_silence_a_new_one_does():
    d = Device(heartbeat_s=60)
    d.read(10, IN, "a")
    assert d.timer(71 * S) != []
    assert d.read(50, IN, "late") == []  # measured before the deadline (70 s): the silence goes on
    assert d.state.last_seen_ms == 50 * S
    assert d.timer(500 * S) == []
    assert d.read(150, IN, "b") == []  # measured after the deadline: the device is back, the rule re-armed
    assert d.timer(210 * S) == []
    assert d.timer(210 * S + 1) == [(SILENT_DEVICE, "b", 210 * S, f"since:{150 * S}")]
    assert [f.anchor for f in d.findings] == [f"since:{10 * S}", f"since:{150 * S}"]


def test_a_reading_that_is_older_than_the_newest_does_not_move_last_seen_back():
    d = Device(heartbeat_s=60)
    d.read(100, IN, "new")
    d.read(30, IN, "old")
    assert (d.state.last_seen_ms, d.state.last_seen_reading) == (100 * S, "new")
    assert d.timer(160 * S) == [] and d.timer(160 * S + 1) != []


def test_a_device_never_heard_from_is_silent_after_its_registration():
    d = Device(at=5 * S, heartbeat_s=30)
    assert d.timer(35 * S) == []
    assert d.timer(35 * S + 1) == [(SILENT_DEVICE, None, 35 * S, f"since:{5 * S}")]
    assert "after the registration" in d.findings[0].evidence


def test_a_decommissioned_device_is_never_silent():
    d = Device(heartbeat_s=60)
    d.read(10, IN)
    d.decommission(20)
    assert next_timer_ms(d.state) is None
    assert d.timer(71 * S) == [] and d.timer(10 ** 12) == []
    assert d.findings == []


def test_an_unregistered_device_has_no_timer():
    assert next_timer_ms(TelemetryState()) is None and on_timer(TelemetryState(), 10 ** 12) == (TelemetryState(), [])


def test_a_scripted_stream_fires_each_rule_exactly_where_expected():
    d = Device(heartbeat_s=60)
    script = [(10, OUT), (20, OUT), (30, IN),                    # run of 2: nothing
              (40, OUT), (50, OUT), (60, OUT), (70, OUT), (80, OUT),  # run of 5: one finding (r60)
              (90, IN), (120, IN), (100, OUT), (110, OUT), (105, OUT)]  # late: 100, 105, 110 (r105)
    for t, value in script:
        d.read(t, value)
        d.timer(t * S)  # a timer at each reading's event time: the device reports every 10-30 s, never silent
    d.timer(180 * S)  # exactly 60 s after the newest reading (120 s)
    d.timer(181 * S)  # silent
    d.read(170, IN, "late")  # before the deadline: same silence
    d.timer(240 * S)
    d.read(400, OUT, "back")
    d.timer(460 * S)
    d.decommission(461)
    d.timer(10 ** 9)
    assert [(f.rule, f.reading_id, f.time_ms) for f in d.findings] == [
        (OUT_OF_RANGE_RUN, "r60", 60 * S), (OUT_OF_RANGE_RUN, "r105", 105 * S), (SILENT_DEVICE, "r120", 180 * S)]


def test_flag_command_ids_are_deterministic_and_distinct():
    assert flag_command_id("d1", OUT_OF_RANGE_RUN, "r60") == flag_command_id("d1", OUT_OF_RANGE_RUN, "r60")
    ids = {flag_command_id(d, rule, a) for d in ("d1", "d2") for rule in RULES for a in ("r60", "since:1000")}
    assert len(ids) == 8


def test_the_state_survives_its_json_encoding_and_goes_on_the_same():
    """What a streaming detector stores between batches: decoded, the state equals the original and a run of 2
    completed after the round trip flags as it would have without it; a flagged silence stays flagged."""
    assert decode_state(encode_state(TelemetryState())) == TelemetryState()
    d = Device(heartbeat_s=60)
    d.read(10, OUT), d.read(20, OUT), d.read(30, IN)
    d.timer(200 * S)
    text = encode_state(d.state)
    assert decode_state(text) == d.state and d.state.silent_since_ms == 30 * S
    d.state = decode_state(text)
    assert d.read(25, IN) == [] and d.read(15, OUT) == [(OUT_OF_RANGE_RUN, "r15")]  # 10, 15, 20
    assert d.timer(10 ** 9) == []  # the silence since 30 s is still the one flagged
