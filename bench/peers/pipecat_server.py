"""Peer for bench/capacity.py: pipecat (pipecat-ai from PyPI) serving many sessions.

Pipecat's ``WebsocketServerTransport`` holds a single client, so the way pipecat serves many
concurrent calls is its FastAPI WebSocket transport with one pipeline per connection (its
telephony examples). Each connection gets::

    PipelineWorker(Pipeline([transport.input(), SyntheticTTSService, transport.output()]))

run by its own ``WorkerRunner``, ``ProtobufFrameSerializer`` (pipecat's client wire format)
and 40 ms output chunks (``audio_out_10ms_chunks=4``, the default). ``SyntheticTTSService``
is a ``TTSService`` that renders the text with the gateway's own synthetic engine
(``SyntheticEngine(rtf=0, ttfa_ms=0)``, same PCM, same 320 ms steps); pipecat's output
transport paces it in real time. On connect it speaks ``--say`` (``TTSSpeakFrame``), unless
``--idle``. Runs in /work/peer-venvs/pipecat (pipecat-ai, fastapi, uvicorn[standard]).

    /work/peer-venvs/pipecat/bin/python bench/peers/pipecat_server.py --port 0 --say TEXT
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastapi import FastAPI, WebSocket  # noqa: E402
from loguru import logger  # noqa: E402
from pipecat.frames.frames import Frame, TTSAudioRawFrame, TTSSpeakFrame  # noqa: E402
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.serializers.protobuf import ProtobufFrameSerializer  # noqa: E402
from pipecat.services.settings import TTSSettings  # noqa: E402
from pipecat.services.tts_service import TTSService  # noqa: E402
from pipecat.transports.websocket.fastapi import (  # noqa: E402
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from bench.peers import serve_uvicorn  # noqa: E402
from engines.base import SynthesisRequest  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402

engine = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu")
engine.prerender()  # as the gateway's bench server does: no rendering while measured
app = FastAPI()
SAY = ""
IDLE = False


class SyntheticTTSService(TTSService):
    """The gateway's synthetic engine as a pipecat TTS service (zero cost, same PCM)."""

    def __init__(self, **kwargs):
        super().__init__(push_start_frame=True, push_stop_frames=True, sample_rate=24000,
                         settings=TTSSettings(model=None, voice=None, language=None), **kwargs)

    def can_generate_metrics(self) -> bool:
        return False

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        stream = engine.open(SynthesisRequest(text=text))
        try:
            while (chunk := stream.step()) is not None:
                yield TTSAudioRawFrame(chunk, 24000, 1, context_id=context_id)
        finally:
            stream.close()


@app.websocket("/v1/voice")
async def voice(ws: WebSocket) -> None:
    await ws.accept()
    transport = FastAPIWebsocketTransport(ws, FastAPIWebsocketParams(
        audio_in_enabled=False, audio_out_enabled=True, audio_out_sample_rate=24000,
        add_wav_header=False, serializer=ProtobufFrameSerializer()))
    worker = PipelineWorker(
        Pipeline([transport.input(), SyntheticTTSService(), transport.output()]),
        params=PipelineParams(audio_out_sample_rate=24000),
        enable_rtvi=False, idle_timeout_secs=None, check_dangling_tasks=False)

    @transport.event_handler("on_client_connected")
    async def on_connected(_transport, _ws):
        if not IDLE:
            await worker.queue_frames([TTSSpeakFrame(SAY)])

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(_transport, _ws):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--say", default="Hello there. This is a synthetic voice.")
    p.add_argument("--idle", action="store_true")
    a = p.parse_args()
    SAY, IDLE = a.say, a.idle
    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("PIPECAT_LOG", "WARNING"))
    serve_uvicorn(app, a.port)
