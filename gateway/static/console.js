// Browser test console for protocol v1 (protocol.md). Plain JS module, no build step.
const RATE = 24000;
const HEADER_BYTES = 12; // u8 version, u8 flags, u16 sentence, u32 turn_id, u32 seq (LE)
const $ = (id) => document.getElementById(id);

// Page state, also read by the headless browser test.
const state = window.consoleState = {
  connected: false, sessionId: null, framesReceived: 0, samplesReceived: 0,
  samplesPlayed: 0, bufferedSamples: 0, playing: false, underruns: 0, workletReports: 0,
  turnId: null, lastTurn: null, turns: [], errors: [], reconnects: 0, audioReady: false,
};

let ws = null;
let backoff = 500;
let turn = null; // {id, sentAt, playedBase, ...} the turn whose audio is playing
let pendingSentAt = null;
let audio = null; // {ctx, node, analyser}

// ---- audio: AudioContext at 24 kHz, an AudioWorklet player, an analyser for the waveform --

let audioStarting = null;
function initAudio() {
  audioStarting ??= startAudio(); // once, however many callers
  return audioStarting;
}

async function startAudio() {
  const ctx = new AudioContext({sampleRate: RATE});
  await ctx.audioWorklet.addModule("/static/worklet.js");
  const node = new AudioWorkletNode(ctx, "pcm-player", {outputChannelCount: [1]});
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 2048;
  node.connect(analyser).connect(ctx.destination);
  node.port.onmessage = (e) => {
    const m = e.data;
    state.samplesPlayed = m.played;
    state.bufferedSamples = m.buffered;
    state.playing = m.playing;
    state.underruns = m.underruns;
    state.workletReports += 1;
  };
  audio = {ctx, node, analyser};
  state.audioReady = true;
  drawWave();
  return audio;
}

function drawWave() {
  const canvas = $("wave");
  const g = canvas.getContext("2d");
  const data = new Float32Array(audio.analyser.fftSize);
  const frame = () => {
    audio.analyser.getFloatTimeDomainData(data);
    g.fillStyle = "#0f1420";
    g.fillRect(0, 0, canvas.width, canvas.height);
    g.strokeStyle = state.playing ? "#64b5f6" : "#37474f";
    g.beginPath();
    for (let i = 0; i < data.length; i++) {
      const x = (i / data.length) * canvas.width;
      const y = (0.5 - data[i] * 0.5) * canvas.height;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    }
    g.stroke();
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}

// ---- the socket, reconnecting with backoff ---------------------------------------------

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  ws = new WebSocket(`${scheme}://${location.host}/v1/voice`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => { backoff = 500; };
  ws.onmessage = (e) => (typeof e.data === "string" ? onEvent(JSON.parse(e.data)) : onFrame(e.data));
  ws.onclose = (e) => {
    const was = state.connected;
    state.connected = false;
    setStatus(false, `disconnected (${e.code})`);
    if (was) showError(`socket closed with ${e.code}; reconnecting`);
    flushAudio();
    turn = null;
    state.reconnects += 1;
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 8000);
  };
}

function send(message) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
  else showError("not connected");
}

function setStatus(on, text) {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${on ? "on" : "off"}`;
}

// ---- server events ------------------------------------------------------------------

function onEvent(ev) {
  switch (ev.type) {
    case "session.created":
    case "session.updated":
      if (ev.type === "session.created") {
        state.connected = true;
        state.sessionId = ev.session_id;
        setStatus(true, `connected · ${ev.session_id}`);
      }
      $("voice").value = ev.session.voice || "";
      $("frame-ms").value = String(ev.session.frame_ms);
      break;
    case "turn.started":
      flushAudio();
      turn = {id: ev.turn_id, source: ev.source, sentAt: pendingSentAt ?? performance.now(),
              playedBase: state.samplesPlayed, firstAudioAt: null};
      state.turnId = ev.turn_id;
      reply = {text: "", cuts: [0]};
      renderReply();
      $("sentences").innerHTML = "";
      break;
    case "text.delta":
      if (turn && ev.turn_id === turn.id) {
        reply.text += ev.delta;
        renderReply();
      }
      break;
    case "sentence": {
      if (!turn || ev.turn_id !== turn.id) break;
      const at = reply.text.indexOf(ev.text, reply.cuts.at(-1)); // exact substring of the reply
      if (at >= 0) {
        reply.cuts.push(at + ev.text.length);
        renderReply();
      }
      const li = document.createElement("li");
      li.value = ev.index;
      li.textContent = ev.text;
      const engine = document.createElement("span");
      engine.className = "engine";
      engine.textContent = ev.engine + (ev.spoken !== ev.text ? ` · spoken: “${ev.spoken}”` : "");
      li.append(engine);
      $("sentences").append(li);
      break;
    }
    case "turn.done":
      if (turn && ev.turn_id === turn.id) {
        if (ev.status === "completed") audio?.node.port.postMessage({type: "end"});
        else flushAudio();
      }
      state.lastTurn = {turnId: ev.turn_id, status: ev.status, metrics: ev.metrics};
      state.turns.push(state.lastTurn);
      addTimeline(ev);
      break;
    case "error":
      showError(`${ev.error.code}: ${ev.error.message}` +
                (ev.turn_id ? ` (turn ${ev.turn_id})` : ""));
      break;
  }
}

// the streamed reply, with a boundary after each sentence the segmenter cut
let reply = {text: "", cuts: [0]};
function renderReply() {
  const parts = reply.cuts.slice(1).map((end, i) => {
    const span = document.createElement("span");
    span.className = "cut";
    span.textContent = reply.text.slice(reply.cuts[i], end);
    return span;
  });
  $("reply").replaceChildren(...parts, reply.text.slice(reply.cuts.at(-1)));
}

function onFrame(buffer) {
  const view = new DataView(buffer);
  const turnId = view.getUint32(4, true);
  state.framesReceived += 1;
  if (!turn || turnId !== turn.id || !audio) return;
  const pcm = new Int16Array(buffer, HEADER_BYTES, (buffer.byteLength - HEADER_BYTES) / 2);
  const samples = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  state.samplesReceived += samples.length;
  if (samples.length) audio.node.port.postMessage({type: "pcm", samples}, [samples.buffer]);
}

function flushAudio() {
  audio?.node.port.postMessage({type: "flush"});
}

// playback marks: what the listener heard of the current turn, every 250 ms while playing
function playedMs() {
  return turn ? Math.max(0, (state.samplesPlayed - turn.playedBase) / RATE * 1000) : 0;
}
let lastMark = null;
setInterval(() => {
  if (!turn || !state.connected || !(state.playing || state.bufferedSamples)) return;
  const ms = Math.round(playedMs());
  if (ms === lastMark) return;
  lastMark = ms;
  send({type: "playback", turn_id: turn.id, played_ms: ms});
}, 250);

// ---- per-turn timeline from turn.done metrics ------------------------------------------

function addTimeline(ev) {
  const m = ev.metrics || {};
  const total = Math.max(m.duration_ms || 0, 1);
  const div = document.createElement("div");
  div.className = "turn";
  const fmt = (v) => (v == null ? "–" : `${Math.round(v)} ms`);
  div.innerHTML = `<div class="label"><b>turn ${ev.turn_id}</b>
    <span class="${ev.status}">${ev.status}</span> · first token ${fmt(m.ttft_ms)}
    · first sentence ${fmt(m.first_sentence_ms)} · first audio ${fmt(m.ttfa_ms)}
    · done ${fmt(m.duration_ms)} · ${fmt(m.audio_ms)} audio · ${m.sentences ?? 0} sentences
    · ${m.engine ?? ""} · underruns ${m.underruns ?? 0}</div>`;
  const bar = document.createElement("div");
  bar.className = "bar";
  const marks = [["ttft_ms", "#8e24aa", "first token"], ["first_sentence_ms", "#f9a825", "first sentence"],
                 ["ttfa_ms", "#2e7d32", "first audio"], ["duration_ms", "#1d2330", "done"]];
  if (m.ttfa_ms != null) {
    const span = document.createElement("div");
    span.className = "span";
    span.style.left = `${(m.ttfa_ms / total) * 100}%`;
    span.style.width = `${((total - m.ttfa_ms) / total) * 100}%`;
    bar.append(span);
  }
  for (const [key, color, label] of marks) {
    if (m[key] == null) continue;
    const mark = document.createElement("div");
    mark.className = "mark";
    mark.title = `${label}: ${Math.round(m[key])} ms`;
    mark.style.left = `calc(${(m[key] / total) * 100}% - 1px)`;
    mark.style.background = color;
    bar.append(mark);
  }
  div.append(bar);
  $("timeline").prepend(div);
}

function showError(text) {
  state.errors.push(text);
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("errors").prepend(li);
}

// ---- controls ----------------------------------------------------------------------

async function sendTranscript(text) {
  text = text.trim();
  if (!text) return;
  await initAudio();
  await audio.ctx.resume();
  if (turn && (state.playing || state.bufferedSamples)) {
    send({type: "playback", turn_id: turn.id, played_ms: Math.round(playedMs())}); // barge-in
    flushAudio();
  }
  pendingSentAt = performance.now();
  send({type: "transcript", text});
}

$("talk").addEventListener("submit", (e) => {
  e.preventDefault();
  sendTranscript($("transcript").value).catch((err) => showError(String(err)));
  $("transcript").value = "";
});

$("stop").addEventListener("click", () => {
  if (!turn) return;
  send({type: "playback", turn_id: turn.id, played_ms: Math.round(playedMs())});
  send({type: "cancel", turn_id: turn.id});
  flushAudio();
});

$("apply").addEventListener("click", () => {
  const session = {frame_ms: Number($("frame-ms").value)};
  if ($("voice").value.trim()) session.voice = $("voice").value.trim();
  if ($("instructions").value.trim()) session.instructions = $("instructions").value.trim();
  send({type: "session.update", session});
});

const Recognition = window.SpeechRecognition || window.webkitSpeechRecognition;
if (Recognition) {
  const mic = $("mic");
  mic.hidden = false;
  mic.addEventListener("click", () => {
    const rec = new Recognition();
    rec.lang = navigator.language || "en-US";
    rec.interimResults = true;
    rec.onresult = (e) => {
      const result = e.results[e.results.length - 1];
      $("transcript").value = result[0].transcript;
      if (result.isFinal) sendTranscript(result[0].transcript).catch((err) => showError(String(err)));
    };
    rec.onerror = (e) => showError(`speech recognition: ${e.error}`);
    rec.start();
  });
}

initAudio().catch((err) => showError(`audio: ${err}`)); // allowed once the user interacts
connect();
