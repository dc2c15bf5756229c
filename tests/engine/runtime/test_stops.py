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


def test_a_cut_inside_a_character_drops_its_bytes_instead_of_showing_U_FFFD(engine):
    """-n (or a cancel) may stop a reply after the first token of a multi-token emoji."""
    import threading
    import time

    from localchat.engine.base import Delta, Message, Request, Result
    from localchat.engine.runtime.stream import EngineHooks, stream_events

    emoji = engine.tokenize_text("ok 🎉")
    first_bytes = engine.vocab.detokenize(emoji[-2])
    assert len(emoji) >= 3 and not first_bytes.decode("utf-8", "ignore").strip()  # a byte piece
    hooks = EngineHooks(detokenize=engine.vocab.detokenize,
                        is_end_of_generation=engine.vocab.is_end_of_generation,
                        prompt_evaluated=lambda: 1, memory=dict)
    events = list(stream_events(Request([Message("user", "hi")]), [1], iter(emoji[:-1]), hooks,
                                budget=len(emoji) - 1, cancel=threading.Event(),
                                t_start=time.perf_counter()))
    result = events[-1]
    assert isinstance(result, Result) and result.finish_reason == "length"
    assert result.text == "ok " and "\ufffd" not in "".join(
        e.text for e in events if isinstance(e, Delta))
