"""The output buffer kept for writing and for resume (``gateway.core.outbox``). Pure."""

from __future__ import annotations

from gateway.core import codec
from gateway.core.outbox import Outbox


def frame(seq: int, ms: int = 40) -> bytes:
    return codec.frame_header(0, 0, 1, seq) + bytes(ms * codec.BYTES_PER_MS)


def written(box: Outbox, *items: str | bytes) -> None:
    for item in items:
        assert box.append(item)
    box.take()


def test_release_drops_what_the_client_has_and_resume_still_starts_after_it():
    box = Outbox()
    written(box, '{"type":"turn.started"}', frame(0), frame(1), '{"type":"sentence"}',
            frame(2), frame(3))
    before = box.nbytes
    assert box.release_through(1) == 3  # the event and frames 0 and 1
    assert box.start == 3 and box.nbytes == before - len(frame(0)) * 2 - 23
    # a client whose last frame is the released one resumes right after it
    assert box.position_after_frame(1) == 3
    assert box.get(3) == '{"type":"sentence"}'
    assert box.position_after_frame(3) == 6
    assert box.position_after_frame(0) is None  # older than what it proved it has


def test_release_never_drops_unwritten_messages_or_an_unknown_frame():
    box = Outbox()
    written(box, frame(0))
    assert box.append(frame(1))  # not written yet
    assert box.release_through(1) == 0 and box.release_through(7) == 0
    assert box.start == 0 and box.pending == 1
    assert box.release_through(0) == 1 and box.pending == 1 and box.take() == [frame(1)]


def test_a_released_boundary_is_gone_once_older_output_is_trimmed_past_it():
    box = Outbox(max_bytes=4 * len(frame(0)))
    written(box, frame(0), frame(1))
    box.release_through(0)
    assert box.position_after_frame(0) == 1
    written(box, frame(2), frame(3), frame(4), frame(5))  # over max_bytes: frame 1 goes
    assert box.start == 2
    assert box.position_after_frame(0) is None and box.position_after_frame(1) is None
    assert box.position_after_frame(2) == 3


def test_extend_is_append_one_by_one():
    """A run of frames (``SendFrames``) goes in with one ``extend``: the same positions,
    bytes, trimming of written output and verdict on the bound as appending each."""
    size = len(frame(0))
    verdicts = {}
    for limit in (size * 10, size * 3 + 30, size * 2 + 10):  # room, trims, over the bound
        one, run = Outbox(max_bytes=limit), Outbox(max_bytes=limit)
        for box in (one, run):
            written(box, '{"type":"turn.started"}', frame(0))
        verdicts[limit] = [one.append(frame(seq)) for seq in (1, 2, 3)]
        assert run.extend([frame(1), frame(2), frame(3)]) == verdicts[limit][-1]
        assert (run.start, run.end, run.cursor, run.nbytes) == \
            (one.start, one.end, one.cursor, one.nbytes)
        assert run.take() == one.take() == [frame(1), frame(2), frame(3)]
    assert list(verdicts.values()) == [[True] * 3, [True] * 3, [True, True, False]]


def test_take_honours_the_limit_and_moves_the_cursor():
    box = Outbox()
    written(box, frame(0))  # written: take starts after it
    assert box.extend([frame(1), frame(2), frame(3)])
    assert box.take(2) == [frame(1), frame(2)] and box.cursor == 3
    assert box.take(5) == [frame(3)] and box.take() == [] and box.pending == 0


def test_events_count_their_utf8_bytes_not_their_characters():
    chinese = '{"type":"text.delta","text":"' + "今天天气很好" * 10 + '"}'
    box = Outbox(max_bytes=len(chinese.encode()))
    assert box.append(chinese) and box.nbytes == len(chinese.encode()) == len(chinese) + 120
    assert not box.append("x")  # one byte more than max_bytes: the bound is on the wire's bytes
    ascii_box = Outbox()
    assert ascii_box.append('{"type":"ping"}') and ascii_box.nbytes == 15


def test_a_replay_does_not_count_against_the_bound_until_it_is_written():
    # A resumed client asked for the replay: it was within max_bytes when first sent, and
    # the output that follows must not close the session as a slow consumer because of it.
    size = len(frame(0))
    box = Outbox(max_bytes=4 * size)
    written(box, frame(0), frame(1), frame(2), frame(3))
    replayed = box.rewind(box.position_after_frame(0))  # the client has frame 0 only
    assert [f[8:12] for f in replayed] == [frame(i)[8:12] for i in (1, 2, 3)]
    assert box.pending == 3
    assert box.append(frame(4)) and box.append(frame(5)) and box.append(frame(6))
    assert box.append(frame(7))  # four new frames: the bound, the replay aside
    assert not box.append(frame(8))  # one more is past it
    box.take(2)  # frames 1 and 2 are written: they count again, as written ones
    assert box.nbytes == 8 * size  # frame 0 was trimmed to make room
    assert box.take() == [frame(i) for i in (3, 4, 5, 6, 7, 8)]
    assert box.append(frame(9)) and box.start == 6  # written ones trimmed, oldest first


def test_a_client_that_received_no_frame_resumes_from_the_start_while_it_is_kept():
    box = Outbox(max_bytes=2 * len(frame(0)))
    written(box, '{"type":"turn.started"}', frame(0))
    assert box.position_after_frame(None) == 0
    written(box, frame(1), frame(2))  # over the bound: the oldest written ones are dropped
    assert box.start > 0 and box.position_after_frame(None) is None


def test_releases_and_a_rewind_after_them_keep_their_positions():
    box = Outbox()
    written(box, frame(0), frame(1), frame(2), frame(3), frame(4))
    assert box.release_through(0) == 1 and box.release_through(2) == 2
    assert box.start == 3 and box.release_through(3) == 1 and box.start == 4
    assert box.append(frame(5)) and box.release_through(5) == 0  # not written yet
    assert box.rewind(4) == [frame(4), frame(5)] and box.take() == [frame(4), frame(5)]


def test_audio_counts_its_bytes_and_a_header_only_frame_is_a_frame():
    audio = codec.frame_header(0, 0, 1, 0) + bytes([0xFF, 0x7F]) * 960
    closing = codec.frame_header(codec.FLAG_TURN_END, 0, 1, 1)  # no samples: the turn's end
    box = Outbox()
    written(box, audio, closing)
    assert box.nbytes == len(audio) + len(closing)
    assert box.position_after_frame(1) == 2 and box.release_through(1) == 2


def test_frames_put_in_with_extend_are_released_and_replayed_as_appended_ones():
    """``extend`` keeps each frame's size as ``append`` does: a release drops exactly the
    bytes of what went, and a resume's replay counts exactly its own bytes."""
    size = len(frame(0))
    for put in (lambda box, fs: [box.append(f) for f in fs], Outbox.extend):
        box = Outbox(max_bytes=4 * size)
        written(box, '{"type":"turn.started"}')
        put(box, [frame(0), frame(1), frame(2)])
        box.take()
        assert box.release_through(0) == 2 and box.nbytes == 2 * size
        assert box.rewind(box.position_after_frame(1)) == [frame(2)]
        # the replay aside, four more frames fit: the bound holds exactly
        assert all([box.append(frame(seq)) for seq in (3, 4, 5, 6)])
        assert not box.append(frame(7))


def test_a_replay_written_in_parts_counts_only_what_was_written():
    """A writer that sends the replay a few messages at a time: the part of it not written
    yet still does not count against ``max_bytes`` (protocol.md, Resume)."""
    size = len(frame(0))
    box = Outbox(max_bytes=4 * size)
    written(box, frame(0), frame(1), frame(2), frame(3))
    box.rewind(box.position_after_frame(0))  # frames 1, 2 and 3 again
    assert box.take(1) == [frame(1)]  # 2 and 3 not written yet: they do not count
    # written: 0 and 1 (trimmed to make room); unwritten and not replayed: the new ones
    assert all([box.append(frame(seq)) for seq in (4, 5, 6, 7)])
    assert box.start == 2
    assert not box.append(frame(8))  # five new frames unread: past the bound


def test_a_client_that_proved_it_has_everything_resumes_with_nothing_to_replay():
    """Marks covered every frame (all released), then the socket dropped between turns:
    a resume after the last frame is at the end, not refused."""
    box = Outbox()
    written(box, '{"type":"turn.started"}', frame(0), frame(1))
    assert box.release_through(1) == 3 and box.nbytes == 0
    assert box.position_after_frame(1) == box.end == 3
    assert box.rewind(3) == [] and box.take() == []
    assert box.position_after_frame(0) is None  # older than what it proved it has


def test_a_fresh_outbox_starts_at_zero_and_knows_no_frame():
    box = Outbox()
    assert (box.start, box.end, box.cursor, box.pending, box.nbytes) == (0, 0, 0, 0, 0)
    assert box.position_after_frame(None) == 0  # nothing sent yet: resume from the start
    assert box.position_after_frame(0) is None  # no frame sent, none released
    assert box.append('{"type":"turn.started"}') and box.append(frame(0))
    assert box.take() == ['{"type":"turn.started"}', frame(0)] and box.cursor == 2
    assert box.position_after_frame(1) is None  # a frame never sent
