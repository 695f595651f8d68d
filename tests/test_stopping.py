from edge.stopping import StopStrings


def feed(stops, pieces):
    s = StopStrings(stops)
    shown = [s.push(p) for p in pieces]
    return shown, s


def test_stop_string_split_across_pieces_is_never_shown():
    shown, s = feed(["</end>"], ["Hello </", "en", "d> more"])
    assert "".join(shown) == "Hello " and s.stopped


def test_held_back_text_is_released_when_it_cannot_start_a_stop():
    shown, s = feed(["STOP"], ["abc S", "T", "x"])
    assert shown == ["abc ", "", "STx"] and not s.stopped


def test_flush_returns_pending_text_and_no_stops_passes_through():
    shown, s = feed(["###"], ["a#", "#"])
    assert "".join(shown) + s.flush() == "a##"
    assert feed([], ["x", "y"])[0] == ["x", "y"]
