from localchat.engine.runtime.stops import StopMatcher


def stream(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    return out, m.stopped


def test_stop_string_split_across_pieces_never_leaks():
    assert stream(["</end>"], ["hello </e", "nd> more"]) == ("hello ", True)


def test_partial_match_that_turns_out_not_to_be_a_stop_is_released():
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == "go "
    assert m.feed("ART") == "START"
    assert m.flush() == "" and not m.stopped


def test_held_back_text_is_flushed_at_end():
    assert stream(["STOP"], ["abc S"]) == ("abc S", False)


def test_earliest_of_several_stops_wins():
    assert stream(["b", "a"], ["xxab"]) == ("xx", True)


def test_no_stops_passes_everything():
    assert stream([], ["a", "b"]) == ("ab", False)
