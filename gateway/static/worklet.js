// AudioWorklet: plays PCM pushed from the page, with a small jitter buffer.
// Messages in:  {type: "pcm", samples: Float32Array}, {type: "end"} (turn over: play out
// what is left), {type: "flush", n} (barge-in: drop everything).
// Messages out: {type: "status", played, buffered, playing, underruns} about every 50 ms while
// those counts change (playing, buffering), the last once they stop: none while idle (an idle
// page took 19 a second, each a callback on its main thread, to say nothing had changed); and
// one at once for each flush, with its `flushed: n`: the counts at the flush, exactly (what
// plays after it is what was sent after it; a status every 50 ms is up to 50 ms stale).
// An underrun is a gap heard: the player ran dry before the turn's end and more audio came
// (as turn.done's metrics count them); running dry on a turn whose last words were said
// while it goes on silently (a code block still streaming) is none.
const PREBUFFER = 2400; // 100 ms at 24 kHz before starting (and after an underrun)

class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.chunks = [];
    this.offset = 0; // read position in chunks[0]
    this.buffered = 0;
    this.played = 0;
    this.playing = false;
    this.ending = false;
    this.underruns = 0;
    this.starved = false; // ran dry before the turn's end: an underrun if more audio comes
    this.quanta = 0;
    this.told = [0, 0, false, 0]; // the counts last reported
    this.port.onmessage = (e) => {
      const m = e.data;
      if (m.type === "pcm") {
        this.chunks.push(m.samples);
        this.buffered += m.samples.length;
        this.ending = false;
        if (this.starved) this.underruns += 1;
        this.starved = false;
      } else if (m.type === "end") {
        this.ending = true;
        this.starved = false;
      } else if (m.type === "flush") {
        this.chunks = [];
        this.offset = 0;
        this.buffered = 0;
        this.playing = false;
        this.ending = false;
        this.starved = false;
        this.report({flushed: m.n});
      }
    };
  }

  report(extra) {
    this.told = [this.played, this.buffered, this.playing, this.underruns];
    this.port.postMessage({type: "status", played: this.played, buffered: this.buffered,
                           playing: this.playing, underruns: this.underruns, ...extra});
  }

  changed() {
    const [played, buffered, playing, underruns] = this.told;
    return this.played !== played || this.buffered !== buffered || this.playing !== playing ||
      this.underruns !== underruns;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    if (!this.playing && (this.buffered >= PREBUFFER || (this.ending && this.buffered > 0))) {
      this.playing = true;
    }
    if (this.playing) {
      while (i < out.length && this.chunks.length) {
        const chunk = this.chunks[0];
        const n = Math.min(out.length - i, chunk.length - this.offset);
        out.set(chunk.subarray(this.offset, this.offset + n), i);
        i += n;
        this.offset += n;
        if (this.offset === chunk.length) {
          this.chunks.shift();
          this.offset = 0;
        }
      }
      this.buffered -= i;
      this.played += i;
      if (this.buffered === 0) {
        this.starved = !this.ending; // mid-turn: rebuffer
        this.playing = false;
      }
    }
    out.fill(0, i);
    if (++this.quanta % 10 === 0 && this.changed()) this.report();
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayer);
