// Browser test console for protocol v1 (protocol.md). Plain JS module, no build step.
const RATE = 24000;
const HEADER_BYTES = 12; // u8 version, u8 flags, u16 sentence, u32 turn_id, u32 seq (LE)
const $ = (id) => document.getElementById(id);

// Page state, also read by the headless browser test.
const state = window.consoleState = {
  connected: false, sessionId: null, framesReceived: 0, samplesReceived: 0,
  samplesPlayed: 0, bufferedSamples: 0, playing: false, underruns: 0, workletReports: 0,
  turnId: null, lastTurn: null, turns: [], errors: [], reconnects: 0, resumes: 0,
  audioReady: false, needsToken: false, originRefused: false, eventsSinceFrame: 0, pongs: 0,
};

const TIMELINE_TURNS = 100; // the turns the timeline keeps, and the errors their list
const MAX_TEXT_CHARS = 4000; // protocol.md, Limits: code points, as the server counts them
// White space as the gateway counts it, refusing a text of only that (Python's str.strip():
// the characters of str.isspace()). JavaScript's trim() differs: U+001C-U+001F and U+0085
// are white space only to Python (a transcript of them was sent, to be refused), U+FEFF
// only to JavaScript (one the gateway takes was kept back).
const GATEWAY_SPACE = String.raw`\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a` +
  String.raw`\u2028\u2029\u202f\u205f\u3000`;
const EDGE_SPACE = new RegExp(`^[${GATEWAY_SPACE}]+|[${GATEWAY_SPACE}]+$`, "g");
const strip = (text) => text.replace(EDGE_SPACE, "");
// A text of only white space and invisible format characters (Unicode's Cf: zero-width
// spaces and joiners, direction marks, U+FEFF) is refused as empty too (codec.blank).
const VISIBLE = new RegExp(`[^${GATEWAY_SPACE}\\p{Cf}]`, "u");
const blank = (text) => !VISIBLE.test(text);
const MAX_INSTRUCTIONS_CHARS = 16000;
const PING_EVERY_MS = 5000;
const SILENT_FOR_MS = 12000; // a ping with nothing at all back for this long: the socket is dead
const PROBE_MS = 3000; // the network back: a ping with nothing back for this long, likewise
const OPEN_WITHIN_MS = 10000; // a socket still connecting after this is given up
const TOKEN_CHECK_MS = 8000; // how often a page asking for a token sees if one is still wanted
// What a subprotocol entry may hold (an HTTP token, RFC 6455 4.1): with any other
// character ("/" and "=" of a base64 token, a space) the WebSocket constructor throws.
const SUBPROTOCOL_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

let ws = null;
let backoff = 500;
let retry = null; // the timer of the next reconnect
let heardAt = 0; // when the socket last gave us anything
let heardCount = 0; // how many messages it gave us (a probe's answer: one more)
let pingedAt = null; // when the first ping with nothing heard since went out
let pendingUpdate = null; // {session, n}: a session.update sent and not answered yet
let sentNo = 0; // numbers what is sent again after a resume, to keep its order
let session = null; // {id, resumeToken, windowS, lastSeq, droppedAt, latestTurn, asked,
// replay}: what a resume needs; asked: [{text, n, stopped}] the transcripts sent whose turns
// have not started, oldest first (the server takes them in order: each starts the next turn,
// or is refused; stopped: Stop was pressed since); replay: {left} while the messages a resume
// re-sends are still coming (how many)
let fresh = null; // a new socket's own session.created, kept while a resume is asked
let token = takeToken();
let turn = null; // {id, playedBase, ended, stopped, ...} the turn whose audio is playing;
// playedBase: the player's count when the turn's audio began (null until the worklet says)
let audio = null; // {ctx, node, analyser}

// ---- audio: AudioContext at 24 kHz, an AudioWorklet player, an analyser for the waveform --

let audioStarting = null;
function initAudio() {
  audioStarting ??= startAudio(); // once, however many callers
  return audioStarting;
}

async function startAudio() {
  if (!window.isSecureContext) { // no AudioWorklet (a hub's LAN address over plain http)
    throw new Error("no sound on a page served over plain http from a name other than " +
                    "localhost (not a secure context): open it with https:// (the gateway's " +
                    "--tls-cert) or at http://localhost; replies show as text");
  }
  const ctx = new AudioContext({sampleRate: RATE});
  await ctx.audioWorklet.addModule(new URL("worklet.js", import.meta.url));
  const node = new AudioWorkletNode(ctx, "pcm-player", {outputChannelCount: [1]});
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 2048;
  node.connect(analyser).connect(ctx.destination);
  ctx.onstatechange = () => {
    if (ctx.state === "closed" && audio?.ctx === ctx) playerGone();
  };
  node.port.onmessage = (e) => {
    const m = e.data;
    state.samplesPlayed = m.played;
    state.bufferedSamples = m.buffered;
    state.playing = m.playing;
    state.underruns = m.underruns;
    state.workletReports += 1;
    if (m.playing) drawWave();
    if (turn && m.flushed !== undefined && m.flushed === turn.flush) { // where it starts
      turn.playedBase = m.played;
      turn.underrunsBase = m.underruns;
    }
    const cut = cutTurns.get(m.flushed);
    if (cut) { // a turn cut by this flush: its count of gaps heard is final, to the flush
      cutTurns.delete(m.flushed);
      if (cut.heard) showHeard(cut);
    }
    if (turn?.stopped?.playedMs === null && m.flushed === turn.stopped.flush) {
      // where Stop silenced it, to the sample (the last periodic count is up to 53 ms old)
      stopHeard(turn, heardMs(turn, m.played));
    }
    heardIfPlayedOut();
  };
  audio = {ctx, node, analyser};
  state.audioReady = true;
  drawWave();
  return audio;
}

// The player gone (its context closed): what waits for its answer or its last sample takes
// the last counts it gave, and the next transcript starts a new one. A cut turn waited for
// the answer for good ("heard …"), and every transcript failed on the closed context.
function playerGone() {
  for (const t of cutTurns.values()) if (t.heard) showHeard(t);
  cutTurns.clear();
  if (turn?.heard) showHeard(turn); // (its tail will not play out)
  audio = audioStarting = null;
  Object.assign(state, {audioReady: false, playing: false, bufferedSamples: 0});
}

// Safari lets only a user's gesture resume a context, starts it suspended and suspends it
// again when the page is left (a call, the phone locked): any tap or key resumes it, not
// only a transcript sent (a reply asked for by the mic, whose result is no gesture, or
// playing when the user comes back would stay silent).
for (const type of ["pointerdown", "keydown"]) {
  document.addEventListener(type, () => {
    if (audio && audio.ctx.state !== "running") audio.ctx.resume().catch(() => {});
  }, true);
}

// The waveform, drawn on each animation frame while there is sound to show: while the
// player plays, and on until the analyser's window (2048 samples, 85 ms) is quiet, so the
// last frame is the flat line. Drawn on every frame, sound or none, an idle page took ~10%
// of a core. A context the browser suspended moves nothing: the worklet's next report
// (playing, once it is resumed) draws again.
let drawing = false;
function drawWave() {
  if (drawing) return;
  drawing = true;
  const canvas = $("wave");
  const g = canvas.getContext("2d");
  const {analyser, ctx} = audio; // (the player may be gone by the next frame)
  const data = new Float32Array(analyser.fftSize);
  const frame = () => {
    analyser.getFloatTimeDomainData(data);
    g.fillStyle = "#0f1420";
    g.fillRect(0, 0, canvas.width, canvas.height);
    g.strokeStyle = state.playing ? "#64b5f6" : "#37474f";
    g.beginPath();
    let quiet = true;
    for (let i = 0; i < data.length; i++) {
      const x = (i / data.length) * canvas.width;
      const y = (0.5 - data[i] * 0.5) * canvas.height;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
      if (Math.abs(data[i]) > 1e-4) quiet = false;
    }
    g.stroke();
    if (ctx.state === "running" && (state.playing || !quiet)) requestAnimationFrame(frame);
    else drawing = false;
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

// The gateway's ``path``, beside the page: a reverse proxy may serve it under a sub-path
// (nginx's location /voice/, Home Assistant's ingress), so no URL starts with "/".
function here(path) {
  return new URL(path, location.href);
}

function connect() {
  clearTimeout(retry);
  retry = null;
  if (ws && ws.readyState <= WebSocket.OPEN) abandon(ws); // one socket at a time
  const query = new URLSearchParams();
  // naming the session to resume lets the socket in even when the gateway is full
  if (session) query.set("resume", session.id);
  // browsers cannot set headers: the token rides as a "bearer.<token>" subprotocol, or in
  // the URL when it has a character a subprotocol cannot hold (the gateway masks it in logs)
  const asProtocol = SUBPROTOCOL_TOKEN.test(token);
  if (token && !asProtocol) query.set("token", token);
  const url = here("v1/voice");
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = String(query);
  const socket = ws = new WebSocket(url, asProtocol ? ["voice.v1", `bearer.${token}`] : ["voice.v1"]);
  let opened = false;
  socket.binaryType = "arraybuffer";
  const opening = setTimeout(() => { // a SYN lost on a dead network may hang for minutes
    if (socket.readyState !== WebSocket.CONNECTING) return;
    abandon(socket);
    state.reconnects += 1;
    reconnectLater();
  }, OPEN_WITHIN_MS);
  socket.onopen = () => {
    clearTimeout(opening);
    opened = true;
    backoff = 500;
    heardAt = performance.now();
    pingedAt = null;
  };
  socket.onmessage = (e) => {
    heardAt = performance.now();
    heardCount += 1;
    if (typeof e.data === "string") {
      onText(JSON.parse(e.data));
    } else {
      onFrame(e.data);
      replayedOne();
    }
  };
  socket.onclose = async (e) => {
    const was = state.connected;
    state.connected = false;
    // (refused before it opened: once /health has said whether the gateway is full, or the
    // status would go from one to the other at every retry, read out each time)
    if (opened) setStatus(false, `disconnected (${e.code})`);
    if (session && session.droppedAt === null) session.droppedAt = performance.now();
    if (!canResume(e.code)) { // the session is gone: so is the audio of a turn it did not end
      giveBackAsked();
      session = null;
      if (!turn?.ended) loseTurn(); // (one that ended plays out: protocol.md, shutting_down)
    }
    if (was && !e.told) {
      showError(e.code === 1001 && e.reason === "server shutting down"
        ? "the gateway stopped; reconnecting for a new session"
        : `socket closed with ${e.code}${e.reason ? ` (${e.reason})` : ""}; reconnecting` +
          (session ? " to resume" : ""));
    }
    state.reconnects += 1;
    if (!opened && (await refusedForToken(e.code))) return; // wait for a token to be typed in
    reconnectLater();
  };
}

// A page the gateway takes for its own without tokens: by IP address, localhost or a name
// under it (hub.localhost: browsers resolve it to the loopback themselves).
function byAddress(host) {
  return host === "localhost" || host.endsWith(".localhost") || host.startsWith("[") ||
    /^\d+\.\d+\.\d+\.\d+$/.test(host);
}

function reconnectLater() {
  retry = setTimeout(connect, backoff);
  backoff = Math.min(backoff * 2, 8000);
}

// Leave a socket behind without hearing from it again (its close would reconnect too).
// Not with 1000, which ends the session: its close frame may still reach the gateway once
// the network is back, and the session is to be resumed (protocol.md, Connection).
function abandon(socket) {
  socket.onopen = socket.onmessage = socket.onclose = null;
  socket.close(4001, "given up: resuming on another socket");
}

// A dropped socket (no close from the server) leaves the session waiting for a resume; a
// close the server chose ends it, and so does its shutdown (1001 "server shutting down").
function canResume(code) {
  if (!session || ![1006, 1011, 1012].includes(code)) return false;
  return performance.now() - session.droppedAt < session.windowS * 1000 - 1000;
}

// A network that drops silently (Wi-Fi gone, a laptop lid) leaves the socket looking open:
// ping, and when nothing at all comes back, give the socket up and resume on a new one.
// Silence is counted from an unanswered ping, not from the last message: a hidden tab's
// timers may run once a minute (Chrome's intensive throttling), and a minute between two
// pings answered at once is no silence.
setInterval(() => {
  if (!ws || ws.readyState !== WebSocket.OPEN || !state.connected) return;
  const now = performance.now();
  if (pingedAt !== null && heardAt >= pingedAt) pingedAt = null; // answered
  if (pingedAt !== null && now - pingedAt > SILENT_FOR_MS) {
    giveUp(ws, SILENT_FOR_MS);
    return;
  }
  pingedAt ??= now;
  send({type: "ping", id: Date.now()});
}, PING_EVERY_MS);

// The browser says the network is back: a socket whose path died while it was gone (another
// Wi-Fi, a laptop woken) still looks open, and the pings would take 12-17 s to tell. Ask now.
// A reconnect waiting its backoff (up to 8 s) goes now, with the backoff started again, and
// so does one still connecting (made on the dying network, it would hang until
// OPEN_WITHIN_MS): not while a token is asked for, the gateway wants one typed in first.
window.addEventListener("online", probeNow);
// The tab is shown again (a phone's browser brought back after minutes in the background):
// its socket may have died meanwhile, unnoticed while its timers were throttled or frozen,
// and the page found out only at the next thing it sent. Ask now, likewise.
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") probeNow();
});

function probeNow() {
  const connecting = ws?.readyState === WebSocket.CONNECTING;
  if ((retry !== null || connecting) && !state.needsToken) {
    if (connecting) state.reconnects += 1; // given up, as at OPEN_WITHIN_MS
    backoff = 500;
    connect(); // (gives up a socket still connecting)
    return;
  }
  if (!connected()) return;
  const socket = ws, before = heardCount;
  send({type: "ping", id: Date.now()});
  setTimeout(() => {
    if (ws === socket && connected() && heardCount === before) giveUp(socket, PROBE_MS);
  }, PROBE_MS);
}

function giveUp(socket, silentMs) {
  showError(`no answer from the gateway for ${silentMs / 1000} s; reconnecting`);
  socket.onclose?.({code: 1006, reason: "", told: true});
  abandon(socket);
}

// A socket refused before it opened (HTTP 401, 403 or 503: a browser is not told which).
// /health (always open) says whether tokens are in use and how full the gateway is;
// /v1/models, whether the token is good. True: wait for a token to be typed in.
async function refusedForToken(code) {
  const health = await askHealth();
  if (health && health.sessions >= health.limits?.max_sessions) {
    setStatus(false, `the gateway is full (${health.sessions} sessions); retrying`);
  } else {
    setStatus(false, `disconnected (${code})`);
  }
  if (health?.auth !== "bearer") {
    if (health && !state.originRefused && !byAddress(location.hostname)) {
      // Without tokens the gateway lets a browser in only from its own page at an IP
      // address or localhost (protocol.md, Origin): any name could be an attacker's,
      // pointed at the hub. Said once; the retries go on (a gateway restarted with --origin).
      state.originRefused = true;
      showError(`the gateway refused this page (${location.origin}): without tokens it ` +
        `admits its console only at an IP address or localhost (http://127.0.0.1:` +
        `${location.port}/ on the hub), or from an origin it is started with: ` +
        `--origin ${location.origin}`);
    }
    return false;
  }
  if (token) {
    const models = await askModels();
    const full = health.sessions >= health.limits?.max_sessions;
    if (models?.status === 200 && !full && !state.originRefused) {
      // A good token, room to spare: what is left is a 403 forbidden_origin (a page the
      // gateway does not serve itself, behind a proxy, outside its --origin list). Neither
      // the socket nor any GET can read it: a same-origin GET carries no Origin, and the
      // gateway answers GETs from any. Said once; the retries go on.
      state.originRefused = true;
      showError(`the gateway refused this page's socket though its token is good and it is ` +
        `not full: most likely its --origin list leaves this page out (start it with ` +
        `--origin ${location.origin}, or add it to [server] origins), or a proxy in between ` +
        `does not pass the WebSocket upgrade on`);
    }
    if (models?.status !== 401) return false; // a good token: refused for another reason
  }
  const why = token ? "the gateway refused this token" : "this gateway needs a token";
  state.needsToken = true;
  // said by the error alone (the status stays "disconnected"): a status saying it too was
  // a second live region, read out as well; the error is read out again at each token refused
  noticeBy($("token-row"));
  showError(`${why}: enter it in the Session panel`);
  $("token-row").hidden = false;
  $("token").focus();
  checkTokenLater();
  return true;
}

// While a token is asked for, the gateway may be started again without tokens, or taking
// the one the page holds (its operator undid the mistake): the page asks every
// TOKEN_CHECK_MS and goes in once none is wanted or its own is good. It waited for good,
// saying a token was needed, until one was typed in or the page reloaded.
let tokenCheck = null;
function checkTokenLater() {
  clearTimeout(tokenCheck);
  tokenCheck = setTimeout(async () => {
    if (!state.needsToken) return; // typed in since
    const health = await askHealth();
    const wanted = !health || // (no answer: nothing known, ask again)
      health.auth === "bearer" && !(token && (await askModels())?.status === 200);
    if (!state.needsToken) return;
    if (wanted) {
      checkTokenLater();
      return;
    }
    state.needsToken = false;
    backoff = 500;
    connect();
  }, TOKEN_CHECK_MS);
}

// /health (null: no answer), and /v1/models's answer to the page's token (401: refused)
function askHealth() {
  return fetch(here("health"), {cache: "no-store"}).then((r) => r.json()).catch(() => null);
}

function askModels() {
  return fetch(here("v1/models"), {cache: "no-store",
    headers: {Authorization: `Bearer ${token}`}}).catch(() => null);
}

// Enter sends the token (a form of one field submits on Enter, a phone's Go too); not the
// field's "change", which fires when it loses the focus: a person clicking away with half
// of it typed sent that half
$("token-row").addEventListener("submit", (e) => {
  e.preventDefault();
  noticeBy($("token-row"));
  if (!$("token").value.trim()) return;
  token = $("token").value.trim();
  sessionStorage.setItem("voiceToken", token);
  $("token").value = "";
  state.needsToken = false;
  backoff = 500;
  connect();
});

function connected() {
  return ws !== null && ws.readyState === WebSocket.OPEN && state.connected && !session?.replay;
}

// Every message goes named (protocol.md: event_id), so that an error answering it says
// which it was: its name, or the one it had when first sent (sent again after a resume).
// Returns the name. What each name was is kept for the latest SENT_NAMES, to say which
// action an error refused.
const SENT_NAMES = 200;
const sentNames = new Map(); // event_id -> what the message was, for the errors
let sentCount = 0;
function send(message) {
  message = {...message, event_id: message.event_id ?? `c${++sentCount}`};
  sentNames.delete(message.event_id); // (the newest last: the oldest go first)
  sentNames.set(message.event_id, sentWhat(message));
  if (sentNames.size > SENT_NAMES) sentNames.delete(sentNames.keys().next().value);
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
  else showError("not connected");
  return message.event_id;
}

// What a message was, as an error refusing it says it: "the transcript “Hello”".
function sentWhat(message) {
  switch (message.type) {
    case "transcript": {
      const text = chars(message.text) > 40 ? `${[...message.text].slice(0, 40).join("")}…`
        : message.text;
      return `the transcript “${text}”`;
    }
    case "session.update": return "the settings";
    case "playback": return `a playback mark of turn ${message.turn_id}`;
    case "cancel": return `Stop of turn ${message.turn_id}`;
    case "session.resume": return "the resume";
    default: return `a ${message.type}`;
  }
}

// (a live region: a text written again, unchanged, is read out again, at every retry)
function setStatus(on, text) {
  const el = $("status");
  if (el.textContent !== text) el.textContent = text;
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
  if (ev.type !== "session.resumed") replayedOne();
}

// One more message of a resume's replay is in; with the last, the session is back.
function replayedOne() {
  if (!session?.replay) return;
  session.replay.left -= 1;
  if (session.replay.left <= 0) resumed();
}

function onEvent(ev) {
  switch (ev.type) {
    case "session.created":
      if (session && session.id !== ev.session_id) { // a new socket: resume the old session
        fresh = ev;
        session.replay = null; // (one a drop cut short: the resume's answer says it again)
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
      setStatus(true, `connected · ${ev.session_id} · resumed (${ev.replayed} re-sent)`);
      showSettings(ev.session, {keepEdits: true}); // (a field being typed in is left alone)
      // what the drop lost is known once the replay is in (resumed): until then nothing is
      // sent (connected() is false), or it would be matched to the replay's answers
      session.replay = {left: ev.replayed - skip};
      if (session.replay.left <= 0) resumed();
      break;
    case "pong":
      state.pongs += 1;
      break;
    case "session.updated":
      pendingUpdate = null;
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
    case "turn.started": {
      const asked = session?.asked.shift(); // (this turn's transcript)
      const stopped = asked?.stopped ? {playedMs: 0} : null; // (Stop came first)
      if (session) session.latestTurn = ev.turn_id;
      { // the turn's count starts where the flush found the player (its answer), not at the
        // last status, up to 50 ms old: what the cut reply played since is not this turn's
        const flush = flushAudio();
        cutHeard(turn, flush); // (one that ended, its tail cut by the new turn)
        turn = {id: ev.turn_id, sessionId: session?.id, source: ev.source, flush,
                playedBase: flush === null ? state.samplesPlayed : null,
                underrunsBase: state.underruns, samplesPosted: 0, marked: 0,
                heard: null, ended: false, stopped, stopSent: stopped !== null};
      }
      state.turnId = ev.turn_id;
      reply = {text: "", cuts: [0]};
      renderReply();
      $("sentences").innerHTML = "";
      $("said").replaceChildren();
      break;
    }
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
      li.dir = "auto";
      li.value = ev.index;
      li.textContent = ev.text;
      const engine = document.createElement("span");
      engine.className = "engine";
      // a segment with nothing to say (a code block, emoji) has no engine and no audio
      engine.textContent = ev.engine === null ? "not spoken: nothing to say"
        : ev.engine + (ev.spoken !== ev.text ? ` · spoken: “${ev.spoken}”` : "");
      // set apart by a margin, which a screen reader does not hear ("Hi.espeak"): a dash
      // for it alone
      li.append(element("span", "visually-hidden", " — "), engine);
      $("sentences").append(li);
      // a page with no sound: a screen reader reads the reply out, a sentence at a time (the
      // reply's own text, token by token, would be read in pieces, or not at all); with
      // sound, the voice says it, and a screen reader saying it too would only mask it
      if (!audio && !turn.stopped) $("said").append(element("p", "", ev.text));
      break;
    }
    case "turn.done":
      state.lastTurn = {turnId: ev.turn_id, status: ev.status, metrics: ev.metrics};
      state.turns.push(state.lastTurn);
      if (state.turns.length > TIMELINE_TURNS) state.turns.shift(); // (as its row)
      addTimeline(ev);
      if (turn && ev.turn_id === turn.id) {
        turn.ended = true;
        turn.heard = $("timeline").querySelector(".heard"); // the row just added
        turn.done = state.lastTurn;
        // a failed turn still plays what it sent (complete sentences); only a cancel flushes
        // (or a Stop: a turn that ended before its cancel came is not played either); a
        // page with no player has nothing to wait for
        if (ev.status === "cancelled" || turn.stopped || !audio) {
          cutHeard(turn, flushAudio());
        } else {
          audio?.node.port.postMessage({type: "end"});
          heardIfPlayedOut();
        }
      }
      break;
    case "error": {
      // The message refused, by the name the error gives it (protocol.md, Errors): the
      // settings, a transcript, or another (a mark, Stop); a turn's error names the
      // transcript that started it. Matched by order instead, the refusal of one was taken
      // for another's: a transcript's for the settings' (put back, and not sent again
      // after a drop), and the transcript was taken as still waiting for its turn.
      const named = ev.error.event_id;
      const what = named === undefined ? undefined : sentNames.get(named);
      let asked, update;
      if (named === undefined) { // (a frame the gateway could not read): by order, as before
        // a transcript refused for the rate (the box was emptied when it went) goes back in
        // the box, to send again once the minute allows; it starts no turn
        asked = ev.error.code === "rate_limited" ? session?.asked.shift() : undefined;
        // (a session.update is never refused for the rate: that is a transcript's answer)
        update = ev.turn_id === undefined && settings && ev.error.code !== "rate_limited" &&
          !(ev.error.code === "resume_failed" && fresh) ? pendingUpdate : null;
      } else if (ev.turn_id === undefined) {
        const at = session?.asked.findIndex((a) => a.id === named) ?? -1;
        // (server_full: refused unread on a socket let in to resume, which closes: it goes
        // again after the resume)
        if (at >= 0 && ev.error.code !== "server_full") asked = session.asked.splice(at, 1)[0];
        update = settings && pendingUpdate?.id === named ? pendingUpdate : null;
      }
      // a transcript refused goes back in the box (emptied when it went), to send again
      const refused = asked && !asked.stopped && backInBox(asked.text);
      const fields = update ? refusedFields(ev.error) : [];
      // the last session's settings given to a new one (the gateway restarted, maybe onto
      // another engine): one refused (a voice this engine lacks) had the others refused with
      // it, the instructions too, unsaid. The rest goes again without it.
      const rest = update?.carried ? withoutFields(update.session, fields) : null;
      showError(`${ev.error.code}: ${ev.error.message}` +
                (ev.turn_id ? ` (turn ${ev.turn_id}${what ? `, ${what}` : ""})`
                  : what ? ` (${what})` : "") +
                (refused ? "; the transcript is back in the box" : "") +
                (rest && Object.keys(rest).length
                  ? "; the last session's other settings were sent again without it" : "") +
                (rest && !Object.keys(rest).length
                  ? "; the last session's settings were not carried over" : ""));
      if (ev.error.code === "resume_failed" && fresh) { // carry on with the new session
        giveBackAsked();
        session = null;
        loseTurn();
        startSession(fresh);
        fresh = null;
        return;
      }
      if (update) {
        pendingUpdate = null;
        // none of it was taken (protocol.md, session.update): the field refused shows the
        // setting in use again; the others keep what was typed in them, to go with it once
        // it is corrected (instructions just written went with a voice's typo)
        showSettings(settings, {keepEdits: true, putBack: fields});
        if (rest && Object.keys(rest).length) {
          pendingUpdate = {n: ++sentNo, session: rest, carried: true};
          pendingUpdate.id = send({type: "session.update", session: rest});
        }
      }
      break;
    }
  }
}

// The replay is in: every transcript the server read before the drop has had its answer
// (its turn.started, or its refusal: the server answers each as it reads it), so each was
// matched to its own, and the page's count of turns is the server's. Counted against
// session.resumed's turn_id instead, a refusal in the replay shifted the count by one: a
// transcript was taken for lost and sent twice, and Stop's cancels went to the turn of one
// sent after Stop.
function resumed() {
  session.replay = null;
  state.resumes += 1;
  // a Stop pressed while the socket was down, or sent and lost with it (the turn did not
  // end): again (protocol.md, Resume: a cancel is idempotent). Transcripts stopped before
  // their turns started: the last one's turn, started in the replay, is this one; the others
  // were cut by the next, or were refused, or lost (not sent again)
  if (turn?.stopped && turn.stopped.playedMs !== null && (!turn.stopSent || !turn.ended)) {
    sendStop(turn);
  }
  sendAgain();
}

// What the drop lost, sent again in the order first sent (protocol.md, Resume: nothing is
// replayed to the server): the transcripts the replay answered neither way, unless Stop was
// pressed since, and a session.update it did not answer.
function sendAgain() {
  const again = [];
  const lost = session.asked.filter((a) => !a.stopped);
  session.asked = lost;
  for (const asked of lost) {
    again.push([asked.n, {type: "transcript", text: asked.text, event_id: asked.id}, true]);
  }
  if (pendingUpdate) {
    again.push([pendingUpdate.n, {type: "session.update", session: pendingUpdate.session,
                                  event_id: pendingUpdate.id}]);
  }
  for (const [, message, bargeIn] of again.sort((a, b) => a[0] - b[0])) {
    if (bargeIn) markBargeIn(); // (the one sent with it was lost too, and is stale now)
    send(message);
  }
}

// the segmenter's first-segment settings, by field (protocol.md, session.update)
const FIRST_SEGMENT = {"first-min-words": "first_min_words",
                       "first-phrase-words": "first_phrase_words",
                       "first-max-words": "first_max_words"};
let settings = null; // the session's settings as the server last reported them
let initial = null; // the session's settings at its session.created
let shown = null; // what showSettings last put in each field
// keepEdits: a field whose value is no longer the one shown (the user is typing in it, or
// applied it and the answer is still to come) is left as it is, unless it is in putBack
function showSettings(s, {keepEdits = false, putBack = []} = {}) {
  settings = state.settings = s;
  const values = {"voice": s.voice || "", "frame-ms": String(s.frame_ms),
                  "instructions": s.instructions || ""};
  for (const [id, key] of Object.entries(FIRST_SEGMENT)) values[id] = String(s.segmenter[key]);
  for (const [id, value] of Object.entries(values)) {
    if (keepEdits && shown && $(id).value !== shown[id] && !putBack.includes(id)) continue;
    $(id).value = value;
  }
  shown = values;
}

// The fields a session.update's refusal names: the voice for unknown_voice, a setting
// quoted in the message ("field 'first_max_words' must be…"); every one if none is named.
function refusedFields(error) {
  if (error.code === "unknown_voice") return ["voice"];
  const keys = {"voice": "voice", "frame-ms": "frame_ms", "instructions": "instructions",
                ...FIRST_SEGMENT};
  const named = Object.keys(keys).filter((id) => error.message.includes(`'${keys[id]}'`));
  return named.length ? named : Object.keys(keys);
}

// The session.update ``update`` less the settings of the fields ``ids``.
function withoutFields(update, ids) {
  const keys = {"voice": "voice", "frame-ms": "frame_ms", "instructions": "instructions"};
  const rest = {...update};
  for (const id of ids) delete rest[keys[id]];
  if (rest.segmenter) {
    const words = {...rest.segmenter};
    for (const id of ids) delete words[FIRST_SEGMENT[id]];
    if (Object.keys(words).length) rest.segmenter = words;
    else delete rest.segmenter;
  }
  return rest;
}

// A session gone with the turn playing: its audio stops; a turn it did not end gets its
// row, "lost" (its turn.done will never come).
function loseTurn() {
  if (turn && !turn.ended) {
    addTimeline({turn_id: turn.id, status: "lost", metrics: {}});
    turn.heard = $("timeline").querySelector(".heard");
  }
  cutHeard(turn, flushAudio());
  turn = null;
}

// A session gone with a transcript it never started a turn for: the transcript, cleared
// from the box when it went, goes back there (unless something else is being typed), to be
// sent again in the new session or not. A stopped one is not wanted any more.
function giveBackAsked() {
  const asked = (session?.asked ?? []).filter((a) => !a.stopped);
  if (!asked.length) return;
  const all = asked.map((a) => a.text).join(" "); // (in the order sent: one line)
  const back = backInBox(all);
  const text = chars(all) > 60 ? `${[...all].slice(0, 60).join("")}…` : all;
  showError(`“${text}” was not answered: its session was lost` +
            (back ? "; it is back in the box, to send again" : ""));
}

// A transcript that went unanswered goes back in the box unless something else is being
// typed there; true when the box holds it.
function backInBox(text) {
  const box = $("transcript");
  if (blank(box.value)) box.value = text;
  return box.value === text;
}

function startSession(ev) {
  const carried = changedSettings(); // (of the session lost, if any)
  state.connected = true;
  pendingUpdate = null;
  if (document.activeElement === $("token")) $("transcript").focus(); // (hidden: nowhere)
  $("token-row").hidden = true; // in: a token typed again would only open another socket
  if (state.sessionId && state.sessionId !== ev.session_id) addSessionMark(ev.session_id);
  state.sessionId = ev.session_id;
  state.eventsSinceFrame = 0;
  session = {id: ev.session_id, resumeToken: ev.resume_token, windowS: ev.resume_window_s,
             lastSeq: -1, droppedAt: null, latestTurn: null, asked: []};
  setStatus(true, `connected · ${ev.session_id}`);
  // an empty Voice field speaks with this one
  $("voice").placeholder = ev.default_voice ? `${ev.default_voice} (default)` : "engine default";
  showSettings(ev.session);
  initial = ev.session;
  // a new session in place of one lost (the gateway restarted) speaks as the user set the
  // last one up, not with the defaults: the voice picked and the instructions typed were
  // silently gone from the fields and from the replies
  if (Object.keys(carried).length) {
    pendingUpdate = {n: ++sentNo, session: carried, carried: true};
    pendingUpdate.id = send({type: "session.update", session: carried});
  }
}

// The settings of the page's fields the user changed in this session: those the server
// last reported (or those applied, not answered yet) that differ from the session's first.
function changedSettings() {
  if (!initial) return {};
  const now = {...settings, ...pendingUpdate?.session};
  const changed = Object.fromEntries(["voice", "frame_ms", "instructions"]
    .filter((key) => now[key] !== initial[key]).map((key) => [key, now[key]]));
  const segmenter = {...settings.segmenter, ...pendingUpdate?.session.segmenter};
  const words = Object.values(FIRST_SEGMENT).filter((key) =>
    segmenter[key] !== initial.segmenter[key]);
  if (words.length) changed.segmenter = Object.fromEntries(words.map((k) => [k, segmenter[k]]));
  return changed;
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
  if (!turn || turnId !== turn.id || turn.stopped || !audio) return; // (Stop: not heard)
  const pcm = new Int16Array(buffer, HEADER_BYTES, (buffer.byteLength - HEADER_BYTES) / 2);
  const samples = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  state.samplesReceived += samples.length;
  turn.samplesPosted += samples.length;
  if (samples.length) audio.node.port.postMessage({type: "pcm", samples}, [samples.buffer]);
}

// Drops what the player holds; the worklet answers with its counts then (a status with
// `flushed`: this number). null: no player.
let flushes = 0;
function flushAudio() {
  if (!audio) return null;
  audio.node.port.postMessage({type: "flush", n: ++flushes});
  return flushes;
}

// playback marks: what the listener heard of the current turn, every 250 ms while playing
// or paused (and once more when its tail has played); none until the worklet has said where the
// turn's count starts (nothing known heard: 0). Heard is what the worklet rendered less what
// the browser says is still on its way to the speaker (100-200 ms on Bluetooth), so a
// barge-in's history keeps no word the listener did not hear; never below a mark sent
// (what was played stays played). Once the player has run dry, all it rendered is heard
// (by the next mark, 250 ms on): that mark says all of it.
function playedMs() {
  if (!turn) return 0;
  const idle = !state.playing && state.bufferedSamples === 0;
  const heard = heardMs(turn, state.samplesPlayed) - (idle ? 0 : outputLagMs());
  return Math.max(0, turn.marked, heard);
}

// The browser's own estimate: baseLatency (graph to system), outputLatency (system to
// speaker; Safari before 18.4 has none: 0)
function outputLagMs() {
  return audio ? ((audio.ctx.baseLatency || 0) + (audio.ctx.outputLatency || 0)) * 1000 : 0;
}

// A player paused with audio of ``t`` still to play: the browser suspended its context
// (Safari when the page is left, until a tap). It says so with the same mark again, or the
// server takes playback as going on and sends ahead as though it was heard (protocol.md,
// playback). Counted from what was posted, not the worklet's buffer: it reports nothing
// while suspended.
function paused(t) {
  return audio !== null && audio.ctx.state !== "running" &&
    t.samplesPosted > state.samplesPlayed - t.playedBase;
}

function sendMark(t, ms) {
  t.marked = Math.max(t.marked, ms);
  send({type: "playback", turn_id: t.id, played_ms: ms});
}

setInterval(() => {
  if (!turn || turn.stopped || turn.playedBase === null || !state.connected) return;
  const ms = Math.round(playedMs());
  if (ms === turn.marked && !paused(turn)) return;
  // a player run dry: its last mark said less than it rendered (the tail still on its way).
  // Not one paused: a context suspended before the turn's audio came says nothing of it
  // (the worklet reports nothing while suspended; its last word, the flush's answer at the
  // turn's start, was "empty, not playing"), and the turn went unmarked while its reply
  // waited unheard: the gateway sent on as though it was heard.
  if (!(state.playing || state.bufferedSamples) && !turn.marked && !paused(turn)) return;
  sendMark(turn, ms);
}, 250);

// ---- per-turn timeline from turn.done metrics ------------------------------------------

function addTimeline(ev) {
  const m = ev.metrics || {};
  const total = Math.max(m.duration_ms || 0, 1);
  const div = document.createElement("div");
  div.className = "turn";
  const fmt = (v) => (v == null ? "–" : `${Math.round(v)} ms`);
  // built from nodes, never innerHTML: every field here is the server's text
  const label = element("div", "label");
  const status = element("span", "", ev.status);
  status.dataset.status = ev.status;
  label.append(element("b", "", `turn ${ev.turn_id}`), " ", status,
    ` · first token ${fmt(m.ttft_ms)} · first sentence ${fmt(m.first_sentence_ms)}` +
    ` · first audio ${fmt(m.ttfa_ms)} · done ${fmt(m.duration_ms)} · ${fmt(m.audio_ms)} audio` +
    ` · ${m.sentences ?? "–"} sentences ${m.engine ? `· ${m.engine} ` : ""}` +
    `· underruns: server ${m.underruns ?? "–"} `, // (a lost turn has no metrics: not 0)
    element("span", "heard", "· heard …"));
  label.lastChild.title = "times this browser ran out of audio while the turn played, " +
    "then more came (gaps heard)";
  div.append(label);
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
  // a page open for hours keeps the latest rows only (and the session marks among them)
  const rows = $("timeline").querySelectorAll(".turn");
  if (rows.length > TIMELINE_TURNS) {
    const last = rows[TIMELINE_TURNS - 1];
    while (last.nextSibling) last.nextSibling.remove();
  }
}

// The turn's row waits for its count: its last sample played, the browser's own count is
// final. (Checked at each status, and at the turn's end: one whose audio played out before
// it ended, a code block still streaming, gets no status after, the player idle.)
function heardIfPlayedOut() {
  if (turn?.heard && turn.playedBase !== null &&
      state.samplesPlayed - turn.playedBase >= turn.samplesPosted) {
    showHeard(turn);
  }
}

// The underruns this browser heard in a turn: the server counts those of its model of the
// listener (turn.done's metrics); the worklet's own count is known once the turn has played
// out (or was cut). It goes in the turn's timeline row and in state.turns.
function showHeard(t) {
  const heard = audio ? state.underruns - t.underrunsBase : null; // (null: no sound here)
  t.heard.textContent = ` · heard ${heard ?? "–"}`;
  if (t.done) t.done.heardUnderruns = heard;
  t.heard = null;
}

// A turn whose row waits for its count (``t.heard``), cut by the flush ``flush``: the count
// goes in when the flush answers, with the player's counts at the cut. The last status is
// up to 50 ms old: a gap counted since (audio come after the player ran dry) was left out.
// No player (null): at once.
const cutTurns = new Map(); // flush number -> the turn it cut
function cutHeard(t, flush) {
  if (!t?.heard) return;
  if (flush === null) showHeard(t);
  else cutTurns.set(flush, t);
}

function element(tag, className, text = "") {
  const el = document.createElement(tag);
  el.className = className;
  el.textContent = text;
  return el;
}

function addSessionMark(id) { // turn ids start again at 1 in a new session
  const div = document.createElement("div");
  div.className = "session-mark";
  div.textContent = `new session ${id}`;
  $("timeline").prepend(div);
}

function showError(text) { // (the latest only, as the timeline: a page open for hours)
  state.errors.push(text);
  if (state.errors.length > TIMELINE_TURNS) state.errors.shift();
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("errors").prepend(li);
  while ($("errors").children.length > TIMELINE_TURNS) $("errors").lastChild.remove();
  $("notice").textContent = text;
  $("notice").hidden = false;
}

// On a phone the Errors panel starts a screen or two down: a refused voice, a transcript
// refused for the rate or not sent were seen by a screen reader only. The newest error
// shows under the form the person last used too (console.css: on a narrow screen only);
// each use of one starts it empty, so what it shows is that use's answer, or later news.
function noticeBy(form) {
  form.after($("notice"));
  $("notice").hidden = true;
}

// ---- controls ----------------------------------------------------------------------

const chars = (text) => [...text].length; // code points

// A barge-in goes after a mark of what was heard of the turn it cuts (protocol.md,
// playback), whether it plays or has run dry (all it had was heard); nobody to tell of a
// stopped turn or one of a session gone.
function markBargeIn() {
  if (!turn || turn.stopped || turn.sessionId !== session?.id) return;
  sendMark(turn, Math.round(playedMs()));
}

// Sends the transcript; false (with the reason shown) when it cannot go. The reply playing
// stops when the server starts the new turn (or ends the old one cancelled), not here: a
// transcript the server refuses (rate_limited) leaves the reply playing, whole.
async function sendTranscript(text) {
  text = strip(text);
  if (blank(text)) return false;
  if (!connected()) {
    showError("not connected: the transcript was not sent");
    return false;
  }
  if (chars(text) > MAX_TEXT_CHARS) {
    showError(`the transcript is ${chars(text)} characters; the limit is ${MAX_TEXT_CHARS}`);
    return false;
  }
  const player = await initAudio().catch(() => null); // (its failure was shown at load)
  // not awaited: a browser lets the context start only after a gesture on the page, and
  // till then its resume() waits (Chromium; one that failed instead dropped the transcript
  // with an error); the reply waits in the player, and a tap starts it (the listeners above)
  player?.ctx.resume().catch(() => {});
  // a Stop just pressed: its exact mark and cancel first (the flush answers in a few ms),
  // or this transcript's turn cuts the stopped reply's history at the last periodic mark
  await turn?.stopped?.known;
  if (!connected()) { // (gone while the audio started)
    showError("not connected: the transcript was not sent");
    return false;
  }
  markBargeIn();
  const id = send({type: "transcript", text});
  session.asked.push({text, n: ++sentNo, id});
  return true;
}

// The transcript box empties once its text is sent, and keeps it when it could not be.
function submitTranscript(text) {
  sendTranscript(text).then((sent) => { if (sent) $("transcript").value = ""; })
    .catch((err) => showError(String(err)));
}

$("talk").addEventListener("submit", (e) => {
  e.preventDefault();
  noticeBy($("talk"));
  submitTranscript($("transcript").value);
});

// Stop: silence now, and nothing more of the turn is played, whatever still arrives (frames
// in flight, or replayed by a resume) before the server ends it. Transcripts sent and their
// turns not started yet (a round trip on a slow network) are the replies being waited for:
// every one is stopped too, not only the last (the first's turn is cut by the next anyway).
function stop() {
  if (session?.asked.some((a) => !a.stopped)) stopAsked();
  if (!turn) return;
  const flush = flushAudio();
  // what was heard: the flush's answer says, exactly (null until it comes, in a few ms;
  // without a player, the count as it stands)
  turn.stopped ??= {playedMs: flush === null ? Math.round(playedMs()) : null, flush};
  if (turn.stopped.playedMs === null) {
    // a player that does not answer gets the last periodic count, up to 53 ms low, rather
    // than no Stop at all (Chromium's worklet answers a flush while its context is
    // suspended too; one that did not would leave Stop unsent)
    const t = turn;
    t.stopped.known = new Promise((resolve) => { t.stopped.resolve = resolve; });
    setTimeout(() => {
      if (t.stopped.playedMs === null) stopHeard(t, heardMs(t, state.samplesPlayed));
    }, 250);
  }
  cutHeard(turn, flush); // it had ended, its tail playing: cut now, count final
  if (turn.sessionId !== session?.id) return; // its session is gone: nobody to tell
  if (!connected()) { // said once the session is back
    showError("not connected: Stop is sent when the session resumes");
    return;
  }
  if (turn.stopped.playedMs !== null) sendStop(turn); // (else once the flush has answered)
}

// What the player's count ``played`` says was heard of ``t`` (nothing while its start is
// unknown: none of it reached the player).
function heardMs(t, played) {
  return t.playedBase === null ? 0 : (played - t.playedBase) / RATE * 1000;
}

// What Stop silenced of ``t`` is known: its mark and cancel go now, if they can.
function stopHeard(t, ms) {
  t.stopped.playedMs = Math.round(Math.max(0, ms));
  if (!t.stopSent && t.sessionId === session?.id && connected()) sendStop(t);
  t.stopped.resolve();
}

// The turns of the transcripts not started yet are the next ones (turn ids go up by 1):
// for each, nothing of it heard, then its cancel. A transcript refused has no turn, so
// the later ones get lower ids than counted: whichever of these ids is in progress when
// they come is cancelled, the others are ignored (a transcript sent after Stop goes after
// them: its turn is not yet). Their turn.started makes them stopped turns; offline, the
// cancel of the one whose turn is in progress goes once the session is back (resumed).
function stopAsked() {
  for (const asked of session.asked) asked.stopped = true;
  if (connected()) sendStopAsked();
  else if (!turn) showError("not connected: Stop is sent when the session resumes");
}

function sendStopAsked() {
  session.asked.forEach((asked, i) => {
    const id = (session.latestTurn ?? 0) + i + 1;
    send({type: "playback", turn_id: id, played_ms: 0});
    send({type: "cancel", turn_id: id});
  });
}

// What was heard (so the history keeps only that), then the cancel.
function sendStop(t) {
  send({type: "playback", turn_id: t.id, played_ms: t.stopped.playedMs});
  send({type: "cancel", turn_id: t.id});
  t.stopSent = true;
}
$("stop").addEventListener("click", () => {
  noticeBy($("talk"));
  stop();
});
// Esc stops the reply, from anywhere but a field of its own: in the token or a setting it
// is the field's (a select closes its list), and while an input method composes, the
// composition's. In the transcript box, beside Stop, it stops.
document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.isComposing || e.defaultPrevented) return;
  const field = e.target.closest?.("input, textarea, select, [contenteditable]");
  if (field && field.id !== "transcript") return;
  noticeBy($("talk"));
  stop();
});

$("settings").addEventListener("submit", (e) => {
  e.preventDefault();
  noticeBy($("settings"));
  const instructions = $("instructions").value.trim();
  if (chars(instructions) > MAX_INSTRUCTIONS_CHARS) {
    showError(`the instructions are ${chars(instructions)} characters; the limit is ` +
              `${MAX_INSTRUCTIONS_CHARS}`);
    return;
  }
  const words = Object.keys(FIRST_SEGMENT).find((id) => $(id).validity.badInput);
  if (words) { // (its value reads as empty, which would ask for the server's default)
    showError(`${FIRST_SEGMENT[words]} must be a number`);
    return;
  }
  if (!connected()) {
    showError("not connected: the settings were not sent");
    return;
  }
  // the fields show what is in use; emptied, they ask for the server's default (null)
  pendingUpdate = {n: ++sentNo, session: {
    frame_ms: Number($("frame-ms").value),
    voice: $("voice").value.trim() || null,
    instructions: instructions || null,
    segmenter: Object.fromEntries(Object.entries(FIRST_SEGMENT).map(([id, key]) =>
      [key, $(id).value.trim() === "" ? null : Number($(id).value)])),
  }};
  pendingUpdate.id = send({type: "session.update", session: pendingUpdate.session});
});

// Enter in the frame's list applies, as in the other fields: a form submits on Enter from
// its text fields only, and a frame picked with the arrows then Enter was shown, not used
$("frame-ms").addEventListener("keydown", (e) => {
  if (e.key !== "Enter") return;
  e.preventDefault();
  $("settings").requestSubmit();
});

const Recognition = window.SpeechRecognition || window.webkitSpeechRecognition;
if (Recognition) {
  const mic = $("mic");
  mic.hidden = false;
  let listening = null;
  mic.addEventListener("click", () => {
    noticeBy($("talk"));
    if (listening) return listening.stop();
    const rec = listening = new Recognition();
    rec.lang = navigator.language || "en-US";
    rec.interimResults = true;
    rec.onresult = (e) => {
      const result = e.results[e.results.length - 1];
      $("transcript").value = result[0].transcript;
      if (result.isFinal) submitTranscript(result[0].transcript);
    };
    rec.onerror = (e) => {
      if (["not-allowed", "service-not-allowed", "audio-capture"].includes(e.error)) {
        mic.hidden = true; // it will not work in this browser: do not offer it again
        showError(`speech recognition is not available here (${e.error}): type the transcript`);
      } else if (e.error !== "no-speech" && e.error !== "aborted") {
        showError(`speech recognition: ${e.error}`);
      }
    };
    // a toggle: its name stays Speak (a new name read as another control), its state is
    // aria-pressed, from the start (index.html), and shows in console.css
    rec.onend = () => {
      listening = null;
      mic.setAttribute("aria-pressed", "false");
    };
    rec.start();
    mic.setAttribute("aria-pressed", "true");
  });
}

initAudio().catch((err) => showError(`audio: ${err}`)); // allowed once the user interacts
connect();
