"""The CLI's documents reach a slow reader whole: ``write_out`` on a pipe that fills."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import pytest

from diagnoser.cli.app import write_out


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "non-blocking"])
def test_a_document_larger_than_the_pipe_arrives_whole(monkeypatch: pytest.MonkeyPatch, blocking: bool) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, blocking)
    # Three times a pipe's 64 KiB, with characters of more than one byte.
    document = ('{"summary": "p99 ≥ 300 ms · pool 10/10"}\n' * 5000)
    received = bytearray()

    def slow_reader() -> None:
        time.sleep(0.3)  # the pipe is full before the first read
        while chunk := os.read(read_fd, 4096):
            received.extend(chunk)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    with os.fdopen(write_fd, "w", encoding="utf-8", closefd=True) as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        write_out(document)
    reader.join(timeout=30)
    os.close(read_fd)
    assert len(document.encode()) > 3 * 65536
    assert bytes(received).decode("utf-8") == document


def test_a_stream_without_a_descriptor_gets_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stdout", captured)
    write_out("{}\n")
    assert captured.getvalue() == "{}\n"
