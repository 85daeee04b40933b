// Browser test of the page `gpumem serve` serves at / (web/: index.html,
// app.js, style.css, embedded into the binary): drives it in headless Chromium
// (playwright-core + Debian's /usr/bin/chromium) and checks it against the
// field table (GET /v1/fields) and the CLI. Run: tests/browser/run.sh (or
// node --test in this directory). GPUMEM_CLI overrides the binary (default
// ../../build/gpumem); CHROMIUM the browser. Offline: loopback only.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const cli = path.resolve(here, process.env.GPUMEM_CLI || '../../build/gpumem');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const screenshot = path.join(here, 'screenshot.png');
const screenshotNarrow = path.join(process.env.TMPDIR || '/tmp', 'gpumem-page-400.png');
const snapshotFixture = path.join(root, 'tests', 'fixtures', 'snapshots', 'train_step.pickle');
const T = 30_000;

// A job that does not fit: llama-3-8b, batch 4 x 4096 tokens, full training on one A100-80GB.
const BIG = { model: 'llama-3-8b', batch: '4', seq: '4096', gpu: 'A100-80GB' };

function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}
async function freePort() {
  for (let i = 0; i < 50; i++) {
    const p = 18000 + Math.floor(Math.random() * 2000);
    if (await portFree(p)) return p;
  }
  throw new Error('no free port in 18000-19999');
}
function runCli(args) {
  return JSON.parse(execFileSync(cli, [...args, '--format', 'json'], { encoding: 'utf8', timeout: T }));
}
const shq = (s) => `'${String(s).replace(/'/g, `'\\''`)}'`;

let server, browser, base, FIELDS, serverLog = '';

before(async () => {
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(cli, ['serve', '--host', '127.0.0.1', '--port', String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout.on('data', (d) => (serverLog += d));
  server.stderr.on('data', (d) => (serverLog += d));
  const deadline = Date.now() + T;
  for (;;) {
    if (server.exitCode !== null) throw new Error(`gpumem serve exited (${server.exitCode}): ${serverLog}`);
    try {
      const r = await fetch(base + '/healthz', { signal: AbortSignal.timeout(2000) });
      if (r.ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`gpumem serve not healthy after ${T} ms: ${serverLog}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  FIELDS = await (await fetch(base + '/v1/fields')).json();
  browser = await chromium.launch({
    executablePath: chromiumPath,
    timeout: T,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  if (server && server.exitCode === null) {
    server.kill('SIGTERM');
    await new Promise((r) => { const t = setTimeout(() => { server.kill('SIGKILL'); r(); }, 5000); server.once('exit', () => { clearTimeout(t); r(); }); });
  }
});

// A page on the service, loopback only, with its JavaScript errors collected.
async function open(t, { width = 1280, height = 1000, query = '' } = {}) {
  const page = await browser.newPage({ viewport: { width, height } });
  page.setDefaultTimeout(T);
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.route('**/*', (route) => (route.request().url().startsWith(base) ? route.continue() : route.abort()));
  await page.goto(base + '/' + query, { timeout: T });
  await page.waitForSelector('body[data-ready="1"]', { timeout: T });
  t.after(async () => {
    await page.close().catch(() => {});
    assert.deepEqual(errors, [], 'no JavaScript errors');
  });
  return page;
}

// Fills the form (field name -> value; selects and checkboxes by type) and runs the command.
async function fill(page, values) {
  for (const [name, v] of Object.entries(values)) {
    const sel = `#f-${name}`;
    // Open the field's group (closed by default outside model, job, gpu).
    const tag = await page.$eval(sel, (e) => { const d = e.closest('details'); if (d) d.open = true; return e.tagName + ':' + e.type; });
    if (tag.startsWith('SELECT')) await page.selectOption(sel, String(v));
    else if (tag.endsWith(':checkbox')) await page.setChecked(sel, !!v);
    else await page.fill(sel, String(v));
  }
}
async function estimate(page, values) {
  await fill(page, values);
  await page.evaluate(() => document.querySelector('#total')?.removeAttribute('data-bytes'));
  const answered = page.waitForResponse((r) => r.url().endsWith('/v1/estimate'));
  await page.click('#run');
  const body = JSON.parse((await answered).request().postData());
  await page.waitForSelector('#total[data-bytes]', { timeout: T });
  return body;
}
async function visible(page, name) {
  return page.$eval(`[data-field="${name}"]`, (e) => !e.hidden && !e.closest('[hidden]'));
}
// One control per name: where two commands' rows share a name (quant), the first row's.
const onPageRule = (f) => f.type !== 'path' && f.type !== 'object' && !f.cli_only && f.name !== 'format' &&
  FIELDS.fields.find((g) => g.name === f.name) === f;

test('the form has a control for every field of estimate, typed, grouped and pre-filled', { timeout: 110_000 }, async (t) => {
  const page = await open(t);
  const want = FIELDS.fields.filter((f) => f.commands.includes('estimate') && onPageRule(f));
  assert.ok(want.length > 40, `estimate has ${want.length} form fields`);
  const controls = await page.$$eval('#fields [data-field]:not(.field)', (es) => es.map((e) => ({
    name: e.dataset.field, tag: e.tagName, type: e.type, min: e.getAttribute('min'), max: e.getAttribute('max'),
    value: e.type === 'checkbox' ? String(e.checked) : e.value, title: e.title, placeholder: e.placeholder,
    options: e.tagName === 'SELECT' ? [...e.options].map((o) => o.value) : null,
  })));
  const byName = new Map(controls.map((c) => [c.name, c]));
  for (const f of want) {
    const c = byName.get(f.name);
    assert.ok(c, `a control for ${f.name}`);
    assert.ok(c.title.startsWith(f.help), `${f.name}: the help is the tooltip`);
    if (f.name === 'model' || f.name === 'gpu') assert.equal(c.tag, 'SELECT', `${f.name}: a list of presets`);
    else if (f.type === 'enum') {
      assert.equal(c.tag, 'SELECT', `${f.name}: enum -> select`);
      assert.deepEqual(c.options.filter((v) => v !== ''), f.values, `${f.name}: the choices`);
      assert.equal(c.value, f.default ?? '', `${f.name}: default selected`);
    } else if (f.type === 'bool') {
      assert.equal(c.type, 'checkbox', `${f.name}: bool -> checkbox`);
      assert.equal(c.value, String(f.default === true), `${f.name}: default`);
    } else if (f.type === 'int' || f.type === 'number') {
      assert.equal(c.type, 'number', `${f.name}: ${f.type} -> number input`);
      assert.equal(c.min, f.min === null ? null : String(f.min), `${f.name}: min`);
      assert.equal(c.max, f.max === null ? null : String(f.max), `${f.name}: max`);
      if (f.default !== null && !f.default_text) assert.equal(Number(c.value), f.default, `${f.name}: default filled in`);
    } else {
      assert.equal(c.type, 'text', `${f.name}: ${f.type} -> text input`);
      if (['size', 'percent', 'count', 'int-list', 'enum-list', 'string-list'].includes(f.type)) assert.match(c.placeholder, /^e\.g\. \S/, `${f.name}: an example`);
    }
  }
  // Nothing else: no file paths, objects or command-line outputs (a name whose
  // first row is on the page keeps that one control).
  for (const f of FIELDS.fields.filter((f) => !onPageRule(f) && !FIELDS.fields.some((g) => g.name === f.name && onPageRule(g))))
    assert.ok(!byName.has(f.name), `no control for ${f.name} (${f.type})`);
  assert.equal(await page.$('#f-config'), null);
  // Groups are the table's, collapsible; the basic ones open.
  const groups = await page.$$eval('#fields details.group', (ds) => ds.map((d) => ({ name: d.dataset.group, open: d.open, title: d.querySelector('summary').textContent })));
  for (const g of groups) {
    const tg = FIELDS.groups.find((x) => x.name === g.name);
    assert.ok(tg, `group ${g.name} is in the table`);
    assert.equal(g.title, tg.title);
    assert.equal(g.open, ['model', 'job', 'gpu'].includes(g.name), `group ${g.name} open only if basic`);
  }
  for (const f of want) {
    const g = await page.$eval(`[data-field="${f.name}"].field`, (e) => e.closest('details').dataset.group);
    assert.equal(g, f.group, `${f.name} in group ${f.group}`);
  }

  // Only changed fields are sent; the total equals the CLI's; the URL mirrors the form.
  const sent0 = await estimate(page, {});
  assert.deepEqual(Object.keys(sent0), ['model'], 'defaults are not sent');
  const sent = await estimate(page, { model: 'llama-3.2-1b', batch: 2, seq: 1024, gpu: 'A100-80GB', 'cuda-lazy-loading': true });
  assert.deepEqual(sent, { model: 'llama-3.2-1b', batch: 2, seq: 1024, gpu: 'A100-80GB' }, 'only the changed fields');
  const shown = await page.getAttribute('#total', 'data-bytes');
  const cliOut = runCli(['estimate', 'llama-3.2-1b', '--batch', '2', '--seq', '1024', '--gpu', 'A100-80GB']);
  assert.equal(BigInt(shown), BigInt(cliOut.per_gpu.total_device), 'page total_device equals the CLI');
  assert.match(await page.textContent('#verdict'), cliOut.per_gpu.fits ? /Fits/ : /not fit/);
  // The range (issue 14): the CLI's low and high, and its verdict.
  assert.equal(BigInt(await page.getAttribute('#range', 'data-low')), BigInt(cliOut.uncertainty.range.low), 'range low equals the CLI');
  assert.equal(BigInt(await page.getAttribute('#range', 'data-high')), BigInt(cliOut.uncertainty.range.high), 'range high equals the CLI');
  assert.match(await page.textContent('#range'), new RegExp(cliOut.uncertainty.verdict));
  const rows = await page.$$eval('#breakdown tbody tr[data-key]', (trs) => trs.map((tr) => tr.dataset.key));
  assert.deepEqual(rows, cliOut.breakdown.map((r) => r.key), 'breakdown rows');
  assert.match(page.url(), /batch=2/, 'settings mirrored into the URL');
  assert.doesNotMatch(page.url(), /optimizer=/, 'defaults stay out of the URL');

  // The shared URL restores the form and runs the estimate.
  const page2 = await open(t, { query: new URL(page.url()).search });
  await page2.waitForSelector('#total[data-bytes]', { timeout: T });
  assert.equal(await page2.getAttribute('#total', 'data-bytes'), shown, 'shared URL reproduces the estimate');
  assert.equal(await page2.inputValue('#f-seq'), '1024');

  // An invalid batch: the API's message (the CLI's wording) shows in #error, the field marked.
  let cliErr = '';
  try {
    execFileSync(cli, ['estimate', 'llama-3.2-1b', '--batch', '-1', '--format', 'json'], { encoding: 'utf8', timeout: T, stdio: 'pipe' });
  } catch (e) { cliErr = String(e.stderr); }
  const cliMsg = cliErr.replace(/^gpumem: error: /, '').trim();
  assert.match(cliMsg, /--batch/);
  await fill(page, { batch: -1 });
  await page.click('#run');
  await page.waitForSelector('#error.show', { state: 'visible', timeout: T });
  const errText = await page.textContent('#error');
  assert.ok(errText.includes(cliMsg), `#error "${errText}" contains the CLI's "${cliMsg}"`);
  assert.ok(await page.$('[data-field="batch"].field.invalid'), 'the batch field is marked');
  await estimate(page, { batch: 2 });
  await page.waitForSelector('#error', { state: 'hidden', timeout: T });

  // Upload a config.json: the page sends it inline; the total equals the CLI on the file.
  const cfgPath = path.join(root, 'data', 'presets', 'configs', 'smollm2-135m.json');
  await page.setInputFiles('#config-file', { name: 'config.json', mimeType: 'application/json', buffer: fs.readFileSync(cfgPath) });
  await page.waitForFunction(() => document.querySelector('#config-note').textContent.startsWith('using'), null, { timeout: T });
  const cfgSent = await estimate(page, {});
  assert.ok(cfgSent.config && !('model' in cfgSent), 'config sent instead of model');
  const cfgCli = runCli(['estimate', cfgPath, '--batch', '2', '--seq', '1024', '--gpu', 'A100-80GB']);
  assert.equal(await page.getAttribute('#total', 'data-bytes'), String(cfgCli.per_gpu.total_device), 'uploaded config.json matches the CLI');
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);
});

test('fields follow the mode and the command', { timeout: 60_000 }, async (t) => {
  const page = await open(t);
  const modeOf = (name) => FIELDS.fields.find((f) => f.name === name).modes;
  assert.deepEqual(modeOf('gen-len'), ['infer']);
  assert.equal(await visible(page, 'grad-accum'), true);
  assert.equal(await visible(page, 'optimizer'), true);
  assert.equal(await visible(page, 'gen-len'), false);
  assert.equal(await visible(page, 'kv-dtype'), false);
  await page.selectOption('#f-mode', 'infer');
  assert.equal(await visible(page, 'gen-len'), true, 'infer shows gen-len');
  assert.equal(await visible(page, 'kv-dtype'), true, 'infer shows kv-dtype');
  assert.equal(await visible(page, 'grad-accum'), false, 'infer hides grad-accum');
  assert.equal(await visible(page, 'optimizer'), false, 'infer hides optimizer');
  assert.equal(await page.isVisible('#f-gen-len'), true, 'gen-len is on screen (job group open)');
  await page.click('details[data-group="precision"] > summary');
  assert.equal(await page.isVisible('#f-kv-dtype'), true, 'kv-dtype is on screen once its group opens');
  assert.equal(await page.isVisible('#f-optimizer'), false);
  // Every field's row is shown exactly when the table says it applies.
  const check = async (cmd, mode) => {
    const shown = await page.$$eval('#fields .field[data-field]', (rs) => Object.fromEntries(rs.map((r) => [r.dataset.field, !r.hidden])));
    for (const f of FIELDS.fields.filter(onPageRule)) {
      if (!(f.name in shown)) continue;
      assert.equal(shown[f.name], f.commands.includes(cmd) && f.modes.includes(mode), `${f.name} for ${cmd} ${mode}`);
    }
  };
  await check('estimate', 'infer');
  // A hidden field is not sent even when it was changed.
  await page.selectOption('#f-mode', 'train');
  await fill(page, { 'grad-accum': 4 });
  await page.selectOption('#f-mode', 'infer');
  await fill(page, { 'gen-len': 128 });
  const body = await page.evaluate(() => window.gpumem.requestBody('estimate'));
  assert.equal(body.grad_accum, undefined, 'grad-accum not sent in infer mode');
  assert.equal(body.gen_len, 128);
  await page.selectOption('#f-mode', 'lora');
  assert.equal(await visible(page, 'lora-rank'), true);
  await check('estimate', 'lora');
  for (const cmd of ['plan', 'sweep', 'fit', 'advise']) {
    await page.selectOption('#command', cmd);
    await check(cmd, 'lora');
  }
  await page.selectOption('#command', 'plan');
  assert.equal(await visible(page, 'top'), true, 'plan shows top');
  assert.equal(await page.isHidden('#config-row'), true, 'config.json is for estimate only');
  await page.selectOption('#command', 'estimate');
  assert.equal(await visible(page, 'top'), false, 'estimate hides top');
});

test('a job that does not fit still draws the capacity line', { timeout: 60_000 }, async (t) => {
  const page = await open(t);
  const geometry = () => page.evaluate(() => {
    const r = (s) => document.querySelector(s)?.getBoundingClientRect();
    const bar = r('#bar'), segs = r('#bar .segs'), cap = r('#cap-line');
    return { bar: bar && { l: bar.left, r: bar.right }, segs: segs && { l: segs.left, r: segs.right }, cap: cap && { l: cap.left, w: cap.width, h: cap.height } };
  });
  await estimate(page, BIG);
  assert.match(await page.textContent('#verdict'), /not fit/);
  assert.equal(await page.isVisible('#cap-line'), true, 'capacity line drawn');
  let g = await geometry();
  assert.ok(g.cap.h > 0 && g.cap.w > 0);
  assert.ok(g.cap.l > g.bar.l && g.cap.l < g.bar.r, 'capacity line inside the bar');
  assert.ok(g.segs.r > g.cap.l + 10, 'the bar runs past the capacity line');
  assert.ok(g.segs.r <= g.bar.r + 0.5, 'the whole total stays visible');
  assert.ok(await page.isVisible('#bar .over'), 'the excess is marked');
  // the catalog capacity as CUDA reports it (A100-80GB: 79.25 GiB, src/memory/gpu_catalog.cpp)
  assert.match(await page.textContent('#cap-line'), /capacity 79\.25 GiB/);
  // A job that fits: the bar ends before the line.
  await estimate(page, { model: 'llama-3.2-1b', batch: 1, seq: 512 });
  assert.match(await page.textContent('#verdict'), /Fits/);
  g = await geometry();
  assert.ok(g.cap.l < g.bar.r && g.segs.r < g.cap.l, 'a fitting bar ends before the capacity line');
});

test('component colours are the same across requests and in the legend', { timeout: 60_000 }, async (t) => {
  const page = await open(t);
  const colours = () => page.evaluate(() => {
    const bg = (e) => getComputedStyle(e).backgroundColor;
    const seg = {}, legend = {}, table = {};
    for (const e of document.querySelectorAll('#bar .seg')) seg[e.dataset.key] = bg(e);
    for (const e of document.querySelectorAll('#legend [data-key] i')) legend[e.parentElement.dataset.key] = bg(e);
    for (const e of document.querySelectorAll('#breakdown tr[data-key] .swatch')) table[e.closest('tr').dataset.key] = bg(e);
    return { seg, legend, table };
  });
  await estimate(page, { model: 'llama-3.2-1b', batch: 2, seq: 1024 });
  const a = await colours();
  await estimate(page, { model: 'qwen2-0.5b', mode: 'lora', batch: 8, seq: 2048, gpu: 'A100-40GB' });
  const b = await colours();
  for (const c of [a, b]) {
    assert.deepEqual(c.legend, c.seg, 'legend colours = bar colours');
    for (const [k, v] of Object.entries(c.seg)) assert.equal(c.table[k], v, `table swatch of ${k}`);
    const vals = Object.values(c.seg);
    assert.equal(new Set(vals).size, vals.length, 'one colour per component');
  }
  const common = Object.keys(a.seg).filter((k) => k in b.seg);
  assert.ok(common.length >= 4, `components in both answers: ${common}`);
  for (const k of common) assert.equal(a.seg[k], b.seg[k], `colour of ${k} in both requests`);
  assert.ok(Object.keys(b.seg).some((k) => !(k in a.seg)) || Object.keys(a.seg).some((k) => !(k in b.seg)), 'the two answers have different components');
});

test('timeline labels never overlap', { timeout: 90_000 }, async (t) => {
  const page = await open(t);
  const jobs = [
    BIG,
    { model: 'llama-3.2-1b', batch: 1, seq: 512, gpu: 'H200-141GB' },
    { model: 'qwen2-0.5b', mode: 'lora', batch: 8, seq: 2048, gpu: 'T4-16GB' },
    { model: 'llama-3.2-1b', mode: 'infer', batch: 4, seq: 2048, 'gen-len': 256, gpu: 'L4-24GB' },
  ];
  for (const job of jobs) {
    await page.selectOption('#f-mode', 'train');
    await fill(page, job);
    await page.evaluate(() => document.querySelector('#timeline').replaceChildren());
    await page.click('#btn-timeline');
    await page.waitForSelector('#timeline svg polyline', { timeout: T });
    const boxes = await page.$$eval('#timeline svg text', (ts) => ts.map((e) => {
      const r = e.getBoundingClientRect();
      return { text: e.textContent, l: r.left, t: r.top, r: r.right, b: r.bottom };
    }));
    assert.ok(boxes.length >= 6, `${job.model}: labels drawn (${boxes.length})`);
    assert.ok(boxes.some((b) => b.text.startsWith('peak ')), 'the peak is labelled');
    const svg = await page.$eval('#timeline svg', (e) => { const r = e.getBoundingClientRect(); return { l: r.left, t: r.top, r: r.right, b: r.bottom }; });
    for (let i = 0; i < boxes.length; i++) {
      const a = boxes[i];
      assert.ok(a.l >= svg.l - 0.5 && a.r <= svg.r + 0.5 && a.t >= svg.t - 0.5 && a.b <= svg.b + 0.5, `"${a.text}" inside the plot`);
      for (let j = i + 1; j < boxes.length; j++) {
        const b = boxes[j];
        const overlap = a.l < b.r && b.l < a.r && a.t < b.b && b.t < a.b;
        assert.ok(!overlap, `${job.model}: labels "${a.text}" and "${b.text}" overlap`);
      }
    }
  }
  // The page shows the service's SVG, the one the CLI writes with --timeline FILE.svg.
  const r = await fetch(base + '/v1/timeline?format=svg', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: 'llama-3.2-1b', seq: 512 }) });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^image\/svg\+xml/);
  const tmp = path.join(fs.mkdtempSync(path.join(process.env.TMPDIR || '/tmp', 'gpumem-web-')), 't.svg');
  execFileSync(cli, ['estimate', 'llama-3.2-1b', '--seq', '512', '--timeline', tmp], { timeout: T });
  assert.equal(await r.text(), fs.readFileSync(tmp, 'utf8'), 'the service renders the CLI\'s SVG');
  fs.rmSync(path.dirname(tmp), { recursive: true });
});

test('advisor remedies are commands to paste', { timeout: 90_000 }, async (t) => {
  const page = await open(t);
  await fill(page, { ...BIG, 'grad-accum': 2, 'cuda-lazy-loading': false });
  await page.click('#btn-advise');
  await page.waitForSelector('#advise .remedy .cmd', { timeout: T });
  const remedies = await page.$$eval('#advise .remedy', (ls) => ls.map((l) => ({
    key: l.dataset.key, total: l.dataset.total, cmd: l.querySelector('.cmd').textContent,
  })));
  assert.ok(remedies.length >= 5, `${remedies.length} remedies`);
  for (const r of remedies) {
    assert.ok(r.cmd.startsWith('gpumem '), `"${r.cmd}" starts with "gpumem "`);
    assert.match(r.cmd, /^gpumem estimate llama-3-8b /);
    assert.doesNotMatch(r.cmd, /\bB\/2\b|\b2?N\b|\b2G\b|>=/, `"${r.cmd}": no placeholders left`);
  }
  // Pasted into a shell, each command gives the memory the advisor reports.
  for (const r of remedies) {
    const out = JSON.parse(execFileSync('bash', ['-c', `${shq(cli)} ${r.cmd.slice('gpumem '.length)} --format json`], { encoding: 'utf8', timeout: T }));
    assert.equal(String(out.per_gpu.total_device), r.total, `${r.key}: \`${r.cmd}\` gives the advisor's total`);
  }
  const combo = await page.$eval('#advise .combination .cmd', (e) => e.textContent).catch(() => null);
  if (combo) {
    assert.ok(combo.startsWith('gpumem '));
    execFileSync('bash', ['-c', `${shq(cli)} ${combo.slice('gpumem '.length)} --format json`], { encoding: 'utf8', timeout: T });
  }
  // The advise command renders the same list in the main card.
  await page.selectOption('#command', 'advise');
  await page.click('#run');
  await page.waitForSelector('#result-body .remedy .cmd', { timeout: T });
  const main = await page.$$eval('#result-body .remedy .cmd', (es) => es.map((e) => e.textContent));
  assert.deepEqual(main, remedies.map((r) => r.cmd));
});

test('the snapshot drop zone accepts a pickle and shows its summary', { timeout: 60_000 }, async (t) => {
  const page = await open(t);
  const bytes = fs.readFileSync(snapshotFixture);
  const answered = page.waitForResponse((r) => r.url().endsWith('/v1/snapshot'));
  await page.evaluate(async ({ b64, name }) => {
    const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([bin], name, { type: 'application/octet-stream' }));
    const zone = document.querySelector('#dropzone');
    for (const type of ['dragenter', 'dragover', 'drop']) zone.dispatchEvent(new DragEvent(type, { bubbles: true, cancelable: true, dataTransfer: dt }));
  }, { b64: bytes.toString('base64'), name: path.basename(snapshotFixture) });
  const resp = await answered;
  assert.equal(resp.status(), 200);
  assert.equal((await resp.request().postDataBuffer()).compare(bytes), 0, 'the raw file bytes are sent');
  await page.waitForSelector('#snapshot-summary', { timeout: T });
  const cliOut = runCli(['snapshot', snapshotFixture]);
  assert.equal(await page.getAttribute('#snapshot-summary', 'data-peak-allocated'), String(cliOut.peak_allocated));
  assert.equal(await page.getAttribute('#snapshot-summary', 'data-peak-reserved'), String(cliOut.peak_reserved));
  const text = await page.textContent('#snapshot-summary');
  assert.match(await page.textContent('#snap-segments'), new RegExp(`^${cliOut.snapshot.segments} at the dump`));
  for (const a of cliOut.top_allocations.slice(0, 3)) assert.ok(text.includes(a.frame), `largest allocation ${a.frame} listed`);
  // Not a snapshot: the service's message shows.
  await page.setInputFiles('#snapshot-file', { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('hello') });
  await page.waitForSelector('#error.show', { timeout: T });
  assert.match(await page.textContent('#error'), /^notes\.txt: /);
});

test('fit, plan and sweep render their answers', { timeout: 90_000 }, async (t) => {
  const page = await open(t);
  const run = async (cmd, values, selector) => {
    await page.selectOption('#command', cmd);
    await fill(page, values);
    const answered = page.waitForResponse((r) => r.url().endsWith('/v1/' + cmd));
    await page.click('#run');
    const resp = await answered;
    assert.equal(resp.status(), 200, `${cmd}: ${await resp.text()}`);
    await page.waitForSelector(`#result-body[data-command="${cmd}"] ${selector}`, { timeout: T });
    return JSON.parse(resp.request().postData());
  };
  await run('fit', { model: 'llama-3.2-1b', seq: 1024, gpu: 'A100-80GB' }, '[data-axis="batch"]');
  const fit = runCli(['fit', 'llama-3.2-1b', '--seq', '1024', '--gpu', 'A100-80GB']);
  assert.equal(await page.getAttribute('[data-axis="batch"] [data-largest]', 'data-largest'), String(fit.batch.largest));
  const planBody = await run('plan', { gpus: 8, top: 3 }, '#plan-table');
  assert.deepEqual(planBody, { model: 'llama-3.2-1b', seq: 1024, gpu: 'A100-80GB', gpus: 8, top: 3 });
  const planCmds = await page.$$eval('#plan-table .cmd', (es) => es.map((e) => e.textContent));
  assert.ok(planCmds.length >= 1 && planCmds.every((c) => c.startsWith('gpumem ')));
  await run('sweep', { gpus: 1, batches: '1,2', seqs: '512,1024' }, '#sweep-table');
  assert.equal(await page.$$eval('#sweep-table tbody tr', (r) => r.length), 4);
  const segColour = await page.$eval('#sweep-table [data-key="weights"]', (e) => getComputedStyle(e).backgroundColor);
  const mapColour = await page.evaluate(() => { const d = document.createElement('i'); d.style.background = window.gpumem.colorOf('weights'); document.body.append(d); const c = getComputedStyle(d).backgroundColor; d.remove(); return c; });
  assert.equal(segColour, mapColour, 'the sweep uses the same colours');
});

test('usable at 400 px: no horizontal scroll, controls stacked', { timeout: 90_000 }, async (t) => {
  const page = await open(t, { width: 400, height: 900 });
  const scrollWidth = () => page.evaluate(() => document.scrollingElement.scrollWidth);
  assert.ok(await scrollWidth() <= 400, `form: scrollWidth ${await scrollWidth()}`);
  // Open every group: every control fits.
  await page.$$eval('#fields details', (ds) => ds.forEach((d) => { d.open = true; }));
  assert.ok(await scrollWidth() <= 400, `all groups open: scrollWidth ${await scrollWidth()}`);
  const stacked = await page.$eval('[data-field="seq"].field', (row) => {
    const l = row.querySelector('label').getBoundingClientRect(), i = row.querySelector('input').getBoundingClientRect();
    return l.bottom <= i.top + 1;
  });
  assert.ok(stacked, 'label above its input at 400 px');
  const side = await page.$eval('#form', (f) => f.getBoundingClientRect());
  const res = await page.$eval('#result', (f) => f.getBoundingClientRect());
  assert.ok(res.top >= side.bottom - 1, 'results below the form');
  await estimate(page, BIG);
  await page.click('#btn-timeline');
  await page.waitForSelector('#timeline svg polyline', { timeout: T });
  await page.click('#btn-advise');
  await page.waitForSelector('#advise .remedy .cmd', { timeout: T });
  await page.setInputFiles('#snapshot-file', snapshotFixture);
  await page.waitForSelector('#snapshot-summary', { timeout: T });
  for (const cmd of ['plan', 'sweep']) {
    await page.selectOption('#command', cmd);
    await page.click('#run');
    await page.waitForSelector(`#result-body[data-command="${cmd}"]`, { timeout: T });
    assert.ok(await scrollWidth() <= 400, `${cmd}: scrollWidth ${await scrollWidth()}`);
  }
  assert.ok(await scrollWidth() <= 400, `results: scrollWidth ${await scrollWidth()}`);
  await page.screenshot({ path: screenshotNarrow, fullPage: true });
  console.log(`screenshot: ${screenshotNarrow}`);
});

test('page assets are served with their types; other methods are 405', async () => {
  for (const [p, type] of [['/', /^text\/html/], ['/app.js', /^text\/javascript/], ['/style.css', /^text\/css/]]) {
    const r = await fetch(base + p);
    assert.equal(r.status, 200, p);
    assert.match(r.headers.get('content-type'), type, p);
    const w = await fetch(base + p, { method: 'POST', body: '' });
    assert.equal(w.status, 405, `POST ${p}`);
  }
  assert.equal((await fetch(base + '/v1/fields', { method: 'POST', body: '' })).status, 405);
  assert.equal((await fetch(base + '/nope.js')).status, 404);
  assert.equal((await fetch(base + '/appXjs')).status, 404, 'asset routes are exact paths');
  const bad = await fetch(base + '/v1/timeline?format=png', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"model":"llama-3.2-1b"}' });
  assert.equal(bad.status, 400);
  // A page elsewhere cannot post without a CORS preflight: text/plain (fetch's default) is refused.
  const plain = await fetch(base + '/v1/estimate', { method: 'POST', body: '{"model":"gpt2"}' });
  assert.equal(plain.status, 415);
});
