"""The fence rule and the token value type, by hypothesis, against the plain statement of R1/R2."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stockade.core import fence
from stockade.core.errors import InvalidArgument
from stockade.core.tokens import FencingToken

CLUSTERS = ["0123456789abcdef", "fedcba9876543210"]
scopes = st.sampled_from(["a", "b", "x.y:z-1_2"])
tokens = st.builds(FencingToken, cluster=st.sampled_from(CLUSTERS), scope=scopes, value=st.integers(1, 2**63 - 1))


@given(st.lists(st.tuples(tokens, scopes), max_size=80), st.booleans())
def test_fence_rule_matches_naive_model(writes, small_values):
    high_water: dict[str, int] = {}
    accepted: dict[str, list[int]] = {}
    for token, scope in writes:
        if small_values:
            token = FencingToken(token.cluster, token.scope, token.value % 5 + 1)
        hw = high_water.get(scope, 0)
        decision = fence.decide(token, cluster=CLUSTERS[0], scope=scope, high_water=hw)
        # the naive statement: foreign tokens are never compared; otherwise accept iff no larger was accepted
        if token.cluster != CLUSTERS[0]:
            assert decision == fence.Reject("wrong-cluster", hw)
        elif token.scope != scope:
            assert decision == fence.Reject("wrong-scope", hw)
        elif all(token.value >= v for v in accepted.get(scope, [])):
            assert decision == fence.Accept(token.value)
            accepted.setdefault(scope, []).append(token.value)
            high_water[scope] = token.value
        else:
            assert decision == fence.Reject("stale", hw)
    for values in accepted.values():
        assert values == sorted(values), "P2: accepted values never go down"


@given(tokens)
def test_encoded_token_round_trips(token):
    text = token.encode()
    assert FencingToken.decode(text) == token
    assert str(token) == text


@given(st.text(max_size=300))
def test_decode_never_crashes_on_garbage(text):
    try:
        token = FencingToken.decode(text)
    except InvalidArgument:
        return
    assert token.encode() == text  # anything accepted is canonical


def test_equal_token_accepted_and_lower_rejected():
    t = FencingToken(CLUSTERS[0], "a", 7)
    assert fence.decide(t, cluster=CLUSTERS[0], scope="a", high_water=7) == fence.Accept(7)
    assert fence.decide(t, cluster=CLUSTERS[0], scope="a", high_water=8) == fence.Reject("stale", 8)
