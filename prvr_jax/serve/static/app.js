// The page of prvr-serve: runs the search named in the URL (?q=...&k=...) on load and on
// submit, lists the ranked videos with their matched span on a timeline, and plays the
// selected video from the span's start when the server serves its source. Text from the
// server is only ever set as textContent (no HTML is built from it).
'use strict';

const $ = (id) => document.getElementById(id);
let startAt = null;  // the span's start: the player seeks there once the video's metadata is in
let stopAt = null;  // the end of the span being played: the player pauses there once

function seconds(t) {
  if (t === null || t === undefined) return '?';
  const m = Math.floor(t / 60);
  const s = (t - 60 * m).toFixed(1).padStart(4, '0');
  return m ? `${m}:${s}` : `${(+t).toFixed(1)} s`;
}

function spanText(span) {
  if (!span) return 'unknown';
  if (span[1] < 60) return `${span[0].toFixed(1)}-${span[1].toFixed(1)} s`;
  return `${seconds(span[0])} - ${seconds(span[1])}`;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setStatus(text, isError) {
  $('status').textContent = text;
  $('status').classList.toggle('error', !!isError);
}

function timeline(result) {
  const bar = element('div', 'timeline');
  bar.title = `span ${spanText(result.span)}`;
  if (result.span && result.duration) {
    const [start, end] = result.span;
    const left = Math.max(0, Math.min(1, start / result.duration));
    const right = Math.max(left, Math.min(1, end / result.duration));
    const marker = element('div', 'span-marker');
    marker.style.left = `${(100 * left).toFixed(2)}%`;
    marker.style.width = `${(100 * (right - left)).toFixed(2)}%`;
    marker.dataset.start = String(start);
    marker.dataset.end = String(end);
    bar.appendChild(marker);
  }
  return bar;
}

function row(result) {
  const item = element('li', 'result');
  item.dataset.rank = String(result.rank);
  item.dataset.video = result.video;
  item.appendChild(element('span', 'rank', String(result.rank)));
  const thumb = element('img', 'thumb');
  thumb.alt = '';
  if (result.thumbnail_url) thumb.src = result.thumbnail_url;
  item.appendChild(thumb);
  item.appendChild(element('span', 'video-id', result.video));
  const span = spanText(result.span);
  const score = result.score === null ? '?' : result.score.toFixed(4);
  item.appendChild(element('span', 'meta',
      `score ${score} · duration ${seconds(result.duration)} · span ${span}` +
      (result.video_url ? '' : ' · no player')));
  item.appendChild(timeline(result));
  item.addEventListener('click', () => select(item, result));
  return item;
}

function select(item, result) {
  for (const other of document.querySelectorAll('.result.selected')) {
    other.classList.remove('selected');
  }
  item.classList.add('selected');
  const player = $('player');
  const still = $('player-still');
  $('player-panel').hidden = false;
  $('player-title').textContent = `${result.rank}. ${result.video}`;
  const start = result.span ? result.span[0] : 0;
  if (result.video_url) {
    still.hidden = true;
    player.hidden = false;
    stopAt = result.span ? result.span[1] : null;
    startAt = start;
    delete player.dataset.seekedTo;
    delete player.dataset.error;
    player.src = `${result.video_url}#t=${start}`;
    $('player-note').textContent = result.span
        ? `Starts at the span ${seconds(start)} and pauses at ${seconds(result.span[1])}.`
        : 'Span unknown: starts at the beginning.';
  } else {
    stopAt = startAt = null;
    player.pause();
    player.removeAttribute('src');
    player.hidden = true;
    still.hidden = !result.thumbnail_url;
    if (result.thumbnail_url) still.src = result.thumbnail_url;
    $('player-note').textContent =
        'No player: the source is a frame folder, or it lies outside the folders the ' +
        'server was allowed to serve (prvr-serve --videos=DIR).';
  }
}

async function search(query, k) {
  const list = $('results');
  list.replaceChildren();
  $('player-panel').hidden = true;
  setStatus(`Searching "${query}"...`);
  let answer;
  try {
    const response = await fetch(`/api/search?${new URLSearchParams({q: query, k})}`);
    answer = await response.json();
    if (!response.ok) {
      setStatus(`Refused (${response.status}): ${answer.error}`, true);
      return;
    }
  } catch (e) {
    setStatus(`Search failed: ${e}`, true);
    return;
  }
  for (const result of answer.results) list.appendChild(row(result));
  setStatus(`${answer.results.length} videos for "${answer.query}" (k=${answer.k})`);
  const first = list.querySelector('.result');
  if (first) select(first, answer.results[0]);
}

async function start() {
  try {
    const limits = await (await fetch('/api/limits')).json();
    $('q').maxLength = limits.max_query_chars;
    $('k').max = limits.max_k;
    $('k').value = limits.default_k;
  } catch (e) { /* the page's defaults stay */ }
  const player = $('player');
  player.addEventListener('loadedmetadata', () => {
    if (startAt !== null) player.currentTime = startAt;
    startAt = null;
  });
  // Where the player stands after a seek (read by the browser test, or in an inspector): the
  // span's start once the server has answered the video's Range requests.
  player.addEventListener('seeked', () => {
    player.dataset.seekedTo = player.currentTime.toFixed(2);
  });
  player.addEventListener('error', () => {
    player.dataset.error = String(player.error && player.error.code);
  });
  player.addEventListener('timeupdate', () => {
    if (stopAt !== null && player.currentTime >= stopAt) {
      stopAt = null;
      player.pause();
    }
  });
  $('search-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const query = $('q').value.trim();
    if (!query) return;
    history.replaceState(null, '', `/?${new URLSearchParams({q: query, k: $('k').value})}`);
    search(query, $('k').value);
  });
  const params = new URLSearchParams(location.search);
  if (params.get('k')) $('k').value = params.get('k');
  if (params.get('q')) {
    $('q').value = params.get('q');
    search(params.get('q').trim(), $('k').value);
  }
}

start();
