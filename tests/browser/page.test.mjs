// Browser test of the page `gpumem serve` serves at /: drives the form in
// headless Chromium (playwright-core + Debian's /usr/bin/chromium) and checks
// the shown total against the CLI. Run: tests/browser/run.sh (or node --test
// in this directory). GPUMEM_CLI overrides the binary (default ../../build/gpumem).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const cli = path.resolve(here, process.env.GPUMEM_CLI || '../../build/gpumem');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const screenshot = path.join(here, 'screenshot.png');
const T = 30_000;

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

let server, browser, base, serverLog = '';

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

test('page estimates, matches the CLI, shows API errors', { timeout: 110_000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(T);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(e.message));
  // Loopback only: refuse anything that is not the service.
  await page.route('**/*', (route) => (route.request().url().startsWith(base) ? route.continue() : route.abort()));

  await page.goto(base + '/', { timeout: T });
  await page.waitForSelector('body[data-ready="1"]', { timeout: T });
  await page.selectOption('#model', 'llama-3.2-1b');
  await page.fill('#batch', '2');
  await page.fill('#seq', '1024');
  await page.selectOption('#gpu', 'A100-80GB');
  await page.click('#run');
  const total = await page.waitForSelector('#total[data-bytes]', { timeout: T });
  const shown = await total.getAttribute('data-bytes');

  const cliOut = JSON.parse(execFileSync(cli, ['estimate', 'llama-3.2-1b', '--batch', '2', '--seq', '1024', '--gpu', 'A100-80GB', '--format', 'json'],
    { encoding: 'utf8', timeout: T }));
  assert.equal(BigInt(shown), BigInt(cliOut.per_gpu.total_device), 'page total_device equals the CLI');
  assert.match(await page.textContent('#verdict'), cliOut.per_gpu.fits ? /Fits/ : /not fit/);
  const rows = await page.$$eval('#breakdown tbody tr[data-key]', (trs) => trs.map((tr) => tr.dataset.key));
  assert.deepEqual(rows, cliOut.breakdown.map((r) => r.key), 'breakdown rows');
  assert.match(page.url(), /batch=2/, 'settings mirrored into the URL');
  assert.equal(await page.isVisible('#error'), false);

  // Timeline section draws a polyline.
  await page.click('#btn-timeline');
  await page.waitForSelector('#timeline svg polyline', { timeout: T });

  // The shareable URL restores the form and runs the estimate.
  const page2 = await browser.newPage();
  await page2.route('**/*', (route) => (route.request().url().startsWith(base) ? route.continue() : route.abort()));
  await page2.goto(page.url(), { timeout: T });
  const t2 = await page2.waitForSelector('#total[data-bytes]', { timeout: T });
  assert.equal(await t2.getAttribute('data-bytes'), shown, 'shared URL reproduces the estimate');
  assert.equal(await page2.inputValue('#seq'), '1024');
  await page2.close();

  // An invalid batch: the API's message (the CLI's wording) shows in #error.
  let cliErr = '';
  try {
    execFileSync(cli, ['estimate', 'llama-3.2-1b', '--batch', '-1', '--format', 'json'], { encoding: 'utf8', timeout: T, stdio: 'pipe' });
  } catch (e) { cliErr = String(e.stderr); }
  const cliMsg = cliErr.replace(/^gpumem: error: /, '').trim();
  assert.match(cliMsg, /--batch/);
  await page.fill('#batch', '-1');
  await page.click('#run');
  await page.waitForSelector('#error.show', { state: 'visible', timeout: T });
  const errText = await page.textContent('#error');
  assert.ok(errText.includes(cliMsg), `#error "${errText}" contains the CLI's "${cliMsg}"`);

  await page.fill('#batch', '2');
  await page.click('#run');
  await page.waitForSelector('#error', { state: 'hidden', timeout: T });
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);

  // Upload a config.json: the page sends it inline; the total equals the CLI on the file.
  const cfgPath = path.join(here, '..', '..', 'data', 'presets', 'configs', 'smollm2-135m.json');
  await page.setInputFiles('#config-file', { name: 'config.json', mimeType: 'application/json', buffer: fs.readFileSync(cfgPath) });
  await page.waitForFunction(() => document.querySelector('#config-note').textContent.startsWith('using'), null, { timeout: T });
  await page.evaluate(() => { const t = document.querySelector('#total'); if (t) t.removeAttribute('data-bytes'); });
  await page.click('#run');
  const t3 = await page.waitForSelector('#total[data-bytes]', { timeout: T });
  const cfgCli = JSON.parse(execFileSync(cli, ['estimate', cfgPath, '--batch', '2', '--seq', '1024', '--gpu', 'A100-80GB', '--format', 'json'],
                                         { encoding: 'utf8', timeout: T }));
  assert.equal(await t3.getAttribute('data-bytes'), String(cfgCli.per_gpu.total_device), 'uploaded config.json matches the CLI');
  assert.deepEqual(pageErrors, [], 'no JavaScript errors');
  await page.close();
});
