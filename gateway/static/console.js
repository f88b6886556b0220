// Browser test console for protocol v1 (protocol.md). Plain JS module, no build step.
const RATE = 24000;
const HEADER_BYTES = 12; // u8 version, u8 flags, u16 sentence, u32 turn_id, u32 seq (LE)
const $ = (id) => document.getElementById(id);

// Page state, also read by the headless browser test.
const state = window.consoleState = {
  connected: false, sessionId: null, framesReceived: 0, samplesReceived: 0,
  samplesPlayed: 0, bufferedSamples: 0, playing: false, underruns: 0, workletReports: 0,
  turnId: null, lastTurn: null, turns: [], errors: [], reconnects: 0, resumes: 0,
  audioReady: false, needsToken: false, eventsSinceFrame: 0,
};

let ws = null;
let backoff = 500;
let session = null; // {id, resumeToken, windowS, lastSeq, droppedAt}: what a resume needs
let fresh = null; // a new socket's own session.created, kept while a resume is asked
let token = takeToken();
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

// A gateway with tokens wants one (protocol.md, Auth): from the page's ?token= (then taken
// out of the address bar) or typed in when the gateway refuses the socket; kept for this tab.
function takeToken() {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem("voiceToken", params.get("token"));
    params.delete("token");
    const query = params.toString();
    history.replaceState(null, "", location.pathname + (query ? `?${query}` : "") + location.hash);
  }
  return sessionStorage.getItem("voiceToken") || "";
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // naming the session to resume lets the socket in even when the gateway is full
  const resume = session ? `?resume=${encodeURIComponent(session.id)}` : "";
  const url = `${scheme}://${location.host}/v1/voice${resume}`;
  // browsers cannot set headers: the token rides as a "bearer.<token>" subprotocol
  const socket = ws = new WebSocket(url, token ? ["voice.v1", `bearer.${token}`] : ["voice.v1"]);
  let opened = false;
  socket.binaryType = "arraybuffer";
  socket.onopen = () => { opened = true; backoff = 500; };
  socket.onmessage = (e) => (typeof e.data === "string" ? onText(JSON.parse(e.data)) : onFrame(e.data));
  socket.onclose = async (e) => {
    const was = state.connected;
    state.connected = false;
    setStatus(false, `disconnected (${e.code})`);
    if (session && session.droppedAt === null) session.droppedAt = performance.now();
    if (!canResume(e.code)) { // the session is gone: so is its audio
      session = null;
      flushAudio();
      turn = null;
    }
    if (was) showError(`socket closed with ${e.code}; reconnecting` + (session ? " to resume" : ""));
    state.reconnects += 1;
    if (!opened && (await refusedForToken())) return; // wait for a token to be typed in
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 8000);
  };
}

// A dropped socket (no close from the server, or "going away") leaves the session waiting
// for a resume; a close the server chose ends it.
function canResume(code) {
  if (!session || ![1001, 1006, 1011, 1012].includes(code)) return false;
  return performance.now() - session.droppedAt < session.windowS * 1000 - 1000;
}

// A socket refused before it opened: /health (always open) says whether tokens are in use.
async function refusedForToken() {
  const health = await fetch("/health", {cache: "no-store"}).then((r) => r.json()).catch(() => null);
  if (health?.auth !== "bearer") return false;
  const why = token ? "the gateway refused this token" : "this gateway needs a token";
  state.needsToken = true;
  setStatus(false, why);
  showError(`${why}: enter it in the Session panel`);
  $("token-row").hidden = false;
  $("token").focus();
  return true;
}

$("token").addEventListener("change", () => {
  token = $("token").value.trim();
  sessionStorage.setItem("voiceToken", token);
  $("token").value = "";
  state.needsToken = false;
  backoff = 500;
  connect();
});

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

// A resume re-sends every message after the last frame we had (protocol.md, Resume); the
// events we had already received after that frame come first: skip exactly those.
let skip = 0;
function onText(ev) {
  if (ev.type === "session.resumed") skip = state.eventsSinceFrame;
  else if (skip > 0 && state.connected) {
    skip -= 1;
    return;
  }
  onEvent(ev);
  if (session && ev.type !== "session.created" && ev.type !== "session.resumed") {
    state.eventsSinceFrame += 1;
  }
}

function onEvent(ev) {
  switch (ev.type) {
    case "session.created":
      if (session && session.id !== ev.session_id) { // a new socket: resume the old session
        fresh = ev;
        send({type: "session.resume", session_id: session.id, resume_token: session.resumeToken,
              last_seq: session.lastSeq});
        break;
      }
      startSession(ev);
      break;
    case "session.resumed":
      fresh = null;
      session.droppedAt = null;
      state.connected = true;
      state.resumes += 1;
      setStatus(true, `connected · ${ev.session_id} · resumed (${ev.replayed} re-sent)`);
      showSettings(ev.session);
      break;
    case "session.updated":
      showSettings(ev.session);
      break;
    case "sentence.done":
      if (ev.cut_short && turn && ev.turn_id === turn.id) {
        const li = [...$("sentences").children].find((el) => el.value === ev.index);
        const note = document.createElement("span");
        note.className = "engine";
        note.textContent = " · cut short: its engine failed mid-sentence";
        li?.append(note);
      }
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
        // a failed turn still plays what it sent (complete sentences); only a cancel flushes
        if (ev.status === "cancelled") flushAudio();
        else audio?.node.port.postMessage({type: "end"});
      }
      state.lastTurn = {turnId: ev.turn_id, status: ev.status, metrics: ev.metrics};
      state.turns.push(state.lastTurn);
      addTimeline(ev);
      break;
    case "error":
      showError(`${ev.error.code}: ${ev.error.message}` +
                (ev.turn_id ? ` (turn ${ev.turn_id})` : ""));
      if (ev.error.code === "resume_failed" && fresh) { // carry on with the new session
        session = null;
        flushAudio();
        turn = null;
        startSession(fresh);
        fresh = null;
      } else if (ev.error.code === "unknown_voice" && settings) {
        showSettings(settings); // the field shows the voice in use, not the one refused
      }
      break;
  }
}

let settings = null; // the session's settings as the server last reported them
function showSettings(s) {
  settings = s;
  $("voice").value = s.voice || "";
  $("frame-ms").value = String(s.frame_ms);
  $("instructions").value = s.instructions || "";
}

function startSession(ev) {
  state.connected = true;
  if (state.sessionId && state.sessionId !== ev.session_id) addSessionMark(ev.session_id);
  state.sessionId = ev.session_id;
  state.eventsSinceFrame = 0;
  session = {id: ev.session_id, resumeToken: ev.resume_token, windowS: ev.resume_window_s,
             lastSeq: -1, droppedAt: null};
  setStatus(true, `connected · ${ev.session_id}`);
  showSettings(ev.session);
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
  if (session) {
    session.lastSeq = view.getUint32(8, true);
    state.eventsSinceFrame = 0;
  }
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
    ${m.engine ? `· ${m.engine} ` : ""}· underruns ${m.underruns ?? 0}</div>`;
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

function addSessionMark(id) { // turn ids start again at 1 in a new session
  const div = document.createElement("div");
  div.className = "session-mark";
  div.textContent = `new session ${id}`;
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
  // the fields show what is in use; emptied, they ask for the server's default (null)
  send({type: "session.update", session: {
    frame_ms: Number($("frame-ms").value),
    voice: $("voice").value.trim() || null,
    instructions: $("instructions").value.trim() || null,
  }});
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
