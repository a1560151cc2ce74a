"""A command holding text that cannot be encoded (a lone surrogate: valid JSON, no UTF-8) is refused by the
client before anything is sent, naming the field and the reason; a whole pair (an emoji) is sent as it is."""
import json

import pytest

from event_store.client import as_command
from event_store.envelope import CommandEnvelope
from event_store.errors import InvalidRecord

OPEN = {"command_type": "OpenAccount", "aggregate_id": "acc-1",
        "payload": {"customer_id": "c1", "credit_limit_minor": 1000, "currency": "EUR"}}


def command(**changes) -> dict:
    """OPEN with changes, as `eventlake submit` reads it: from JSON text (whose escapes make the surrogates)."""
    obj = json.loads(json.dumps(OPEN))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = obj
        for name in parents:
            target = target[name]
        target[last] = value
    return json.loads(json.dumps(obj).replace("SURROGATE", "\\ud800").replace("LOW", "\\udc00"))


@pytest.mark.parametrize("changes, field, code", [
    ({"aggregate_id": "acc-SURROGATE"}, "aggregate_id", "U+D800"),
    ({"command_id": "cmd-LOW"}, "command_id", "U+DC00"),
    ({"payload__customer_id": "cSURROGATEx"}, "payload.customer_id", "U+D800"),
    ({"correlation_id": "corr-LOW"}, "correlation_id", "U+DC00"),
])
def test_a_lone_surrogate_anywhere_is_refused_naming_the_field(changes, field, code):
    with pytest.raises(InvalidRecord) as refused:
        as_command(command(**changes))
    message = str(refused.value)
    assert f"field '{field}'" in message and f"lone surrogate {code}" in message, message
    assert "cannot encode" in message, message


def test_an_envelope_built_in_code_is_checked_too():
    envelope = CommandEnvelope.create("OpenAccount", "acc-\udfff", OPEN["payload"])
    with pytest.raises(InvalidRecord, match="field 'aggregate_id'.*lone surrogate U\\+DFFF"):
        as_command(envelope)


def test_a_whole_surrogate_pair_and_other_unicode_are_sent():
    text = json.loads('"acc-\\ud83d\\ude00-\\u00e9-\\u4e2d"')  # an emoji (astral), e-acute, a CJK character
    sent = as_command(command(aggregate_id=text))
    assert sent.aggregate_id == "acc-😀-é-中"
    assert sent.aggregate_id.encode() and sent.to_json()
