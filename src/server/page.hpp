// src/server/page.hpp — the single-page front end GET / serves: inline CSS and
// vanilla JS, no external assets. It calls the same-origin JSON API (/v1/...),
// mirrors the form into the URL query string, and is exercised by
// tests/browser/page.test.mjs.
#pragma once

namespace gpumem::server {

inline constexpr const char* kIndexHtml = R"GPUMEMHTML(<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>gpumem — GPU memory estimator</title>
<style>
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f4f6fa}
header{background:#1d2330;color:#fff;padding:10px 20px}header h1{margin:0;font-size:20px}header span{opacity:.7;margin-left:8px}
main{display:grid;grid-template-columns:300px 1fr;gap:16px;padding:16px;max-width:1400px;margin:auto}
@media(max-width:800px){main{grid-template-columns:1fr}}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0002;padding:14px;margin-bottom:16px}
.card h2{font-size:16px;margin:0 0 10px}
form label{display:flex;justify-content:space-between;align-items:center;margin:5px 0;gap:8px}
form select,form input{width:170px;padding:3px 5px;font:inherit}
.row3{display:grid;grid-template-columns:repeat(4,1fr);gap:6px}.row3 label{display:block}.row3 input{width:100%}
button{font:inherit;padding:6px 14px;border:0;border-radius:5px;background:#3563e9;color:#fff;cursor:pointer}
button:disabled{opacity:.5;cursor:wait}button.sec{background:#e6ebf5;color:#1d2330}
.note{font-size:12px;color:#667}
#error{display:none;background:#fde8e8;color:#8a1c1c;border:1px solid #f3b4b4;border-radius:6px;padding:8px 12px;margin-bottom:12px}
#error.show{display:block}
#verdict{font-size:22px;font-weight:600}.fits{color:#177a3a}.nofit{color:#b42318}
#total{font-size:15px;margin-top:4px}
.bar{display:flex;height:30px;border-radius:4px;overflow:hidden;background:#e9edf3;border:1px solid #cfd6e2;position:relative}
.bar div{height:100%}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin-top:6px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:4px 6px;border-bottom:1px solid #e3e7ee}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.muted{color:#889}svg{width:100%;height:260px;background:#fbfcfe;border:1px solid #e3e7ee;border-radius:4px}
ol li{margin:4px 0}.tag{font-size:11px;padding:1px 6px;border-radius:8px;background:#e6ebf5;margin-left:6px}
</style></head>
<body>
<header><h1>gpumem<span>GPU memory prediction for deep-learning jobs</span></h1></header>
<main>
<section>
<form id="form" class="card" autocomplete="off">
<h2>Job</h2>
<label>Model <select id="model" name="model"></select></label>
<label>or config.json <input id="config-file" type="file" accept=".json,application/json"></label>
<p class="note" id="config-note">A Hugging Face config.json is read in the browser and sent with the request (estimate and timeline); the service reads no files.</p>
<label>Mode <select id="mode" name="mode"><option>train</option><option>lora</option><option>qlora</option><option>infer</option></select></label>
<label>Batch (per GPU) <input id="batch" name="batch" type="number" value="1"></label>
<label>Sequence length <input id="seq" name="seq" type="number" value="2048"></label>
<label>Precision <select id="precision" name="precision"><option value="">default</option><option>fp32</option><option>fp16</option><option>bf16</option><option>amp-fp16</option><option>amp-bf16</option></select></label>
<label>Optimizer <select id="optimizer" name="optimizer"><option>adamw</option><option>adam</option><option>adamw-8bit</option><option>adafactor</option><option>lion</option><option>sgd</option><option>sgd-momentum</option></select></label>
<label>Recompute <select id="recompute" name="recompute"><option>none</option><option>selective</option><option>full</option></select></label>
<label>Attention <select id="attention" name="attention"><option>flash</option><option>eager</option></select></label>
<label>GPU <select id="gpu" name="gpu"></select></label>
<div class="row3">
<label>GPUs<input id="gpus" name="gpus" type="number" value="1"></label>
<label>TP<input id="tp" name="tp" type="number" value="1"></label>
<label>PP<input id="pp" name="pp" type="number" value="1"></label>
<label>ZeRO<input id="zero" name="zero" type="number" value="0"></label>
</div>
<p><button id="run" type="submit">Estimate</button></p>
</form>
</section>
<section>
<div id="error" role="alert"></div>
<div class="card" id="result"><h2>Estimate</h2>
<div id="verdict" class="muted">Pick a job and press Estimate.</div>
<div id="totalbox"></div>
<div id="barbox" style="margin-top:10px"></div>
<table id="breakdown"><thead><tr><th>Component</th><th class="n">Bytes</th><th class="n">GiB</th><th class="n">Share</th><th>Detail</th></tr></thead><tbody></tbody></table>
</div>
<div class="card"><h2>Timeline <button class="sec" id="btn-timeline" type="button">Load</button></h2><div id="timeline" class="note">Allocated and reserved memory over the simulated steps.</div></div>
<div class="card"><h2>Advisor <button class="sec" id="btn-advise" type="button">Load</button></h2><div id="advise" class="note">Ranked techniques to cut memory.</div></div>
<div class="card"><h2>Planner <button class="sec" id="btn-plan" type="button">Load</button></h2><div id="plan" class="note">Best parallel layouts for the chosen number of GPUs (top 5).</div></div>
</section>
</main>
<script>
"use strict";
const $=s=>document.querySelector(s);
const FIELDS=["model","mode","batch","seq","precision","optimizer","recompute","attention","gpu","gpus","tp","pp","zero"];
const NUM=new Set(["batch","seq","gpus","tp","pp","zero"]);
const DEF={mode:"train",precision:"",optimizer:"adamw",recompute:"none",attention:"flash",gpus:"1",tp:"1",pp:"1",zero:"0"};
const COLORS=["#3563e9","#f59e0b","#10b981","#ef4444","#8b5cf6","#06b6d4","#ec4899","#84cc16","#64748b","#a16207","#0ea5e9","#d946ef"];
const esc=s=>String(s).replace(/[&<>"']/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
function fmt(b){const u=["B","KiB","MiB","GiB","TiB"];let i=0,v=Math.abs(b);while(v>=1024&&i<4){v/=1024;i++}return (b<0?"-":"")+v.toFixed(i?2:0)+" "+u[i]}
const gib=b=>(b/1073741824).toFixed(2);
function showError(msg){const e=$("#error");e.textContent=msg;e.classList.toggle("show",!!msg)}
let CONFIG=null;
function body(){const b={};for(const f of FIELDS){const v=$("#"+f).value.trim();if(v==="")continue;
  if(NUM.has(f)){const n=Number(v);b[f]=Number.isFinite(n)?n:v}else b[f]=v}
  if(CONFIG){delete b.model;b.config=CONFIG}return b}
function syncUrl(){const q=new URLSearchParams();for(const f of FIELDS){const v=$("#"+f).value;if(v!==""&&v!==DEF[f])q.set(f,v)}
  history.replaceState(null,"",location.pathname+(q.toString()?"?"+q:""))}
async function api(path,b){let r;try{r=await fetch(path,b===undefined?{}:{method:"POST",headers:{"Content-Type":"application/json"},body:JSON.stringify(b)})}
  catch(e){throw new Error("network error: "+e.message)}
  let d;try{d=await r.json()}catch(e){throw new Error("HTTP "+r.status+": the response is not JSON")}
  if(!r.ok||d.error){const e=d.error||{};throw new Error((e.message||("HTTP "+r.status))+(e.field?" (field: "+e.field+")":""))}
  return d}
function setOpts(sel,items,want){sel.innerHTML=items.map(x=>'<option value="'+esc(x.v)+'">'+esc(x.t)+"</option>").join("");if(want&&items.some(x=>x.v===want))sel.value=want}
async function run(kind,btn,fn){showError("");btn.disabled=true;syncUrl();try{await fn()}catch(e){showError(e.message)}finally{btn.disabled=false}}
async function estimate(){const d=await api("/v1/estimate",body());const p=d.per_gpu,cap=p.capacity||(d.gpu&&d.gpu.memory)||0;
  const v=$("#verdict");v.className=p.fits?"fits":"nofit";v.textContent=p.fits?"✓ Fits on "+d.gpu.name:"✗ Does not fit on "+d.gpu.name;
  $("#totalbox").innerHTML='<div id="total" data-bytes="'+p.total_device+'" data-capacity="'+cap+'"><b>'+fmt(p.total_device)+"</b> of "+fmt(cap)+
   " per GPU ("+(cap?(100*p.total_device/cap).toFixed(1):"?")+"%) · peak allocated "+fmt(p.peak_allocated)+" · reserved "+fmt(p.peak_reserved)+
   (d.time&&d.time.step_seconds?" · step "+d.time.step_seconds.toFixed(3)+" s":"")+"</div>";
  const rows=d.breakdown||[],scale=Math.max(cap,p.total_device)||1;
  $("#barbox").innerHTML='<div class="bar" title="capacity '+fmt(cap)+'">'+rows.map((r,i)=>'<div style="width:'+(100*r.bytes/scale)+"%;background:"+COLORS[i%COLORS.length]+'" title="'+esc(r.label+": "+fmt(r.bytes))+'"></div>').join("")+
   "</div>"+'<div class="legend">'+rows.map((r,i)=>'<span><i style="background:'+COLORS[i%COLORS.length]+'"></i>'+esc(r.label)+"</span>").join("")+
   '<span class="muted">bar = '+fmt(scale)+(p.total_device>cap?" (total; over capacity)":" (GPU capacity)")+"</span></div>";
  $("#breakdown tbody").innerHTML=rows.map((r,i)=>'<tr data-key="'+esc(r.key)+'"><td><i style="display:inline-block;width:10px;height:10px;margin-right:6px;background:'+COLORS[i%COLORS.length]+'"></i>'+esc(r.label)+
   '</td><td class="n">'+r.bytes.toLocaleString("en-US")+'</td><td class="n">'+gib(r.bytes)+'</td><td class="n">'+(p.total_device?(100*r.bytes/p.total_device).toFixed(1):0)+"%</td><td class=muted>"+esc(r.detail||"")+"</td></tr>").join("")+
   '<tr><th>total per GPU</th><th class="n">'+p.total_device.toLocaleString("en-US")+'</th><th class="n">'+gib(p.total_device)+"</th><th></th><th>"+(d.warnings||[]).map(esc).join("; ")+"</th></tr>"}
async function timeline(){const d=await api("/v1/timeline",body());const t=d.timeline||[];if(!t.length){$("#timeline").textContent="no timeline (inference or no simulation)";return}
  const W=1000,H=240,P=40,step=Math.max(1,Math.ceil(t.length/1500)),pts=t.filter((_,i)=>i%step===0||i===t.length-1);
  const maxY=Math.max(...pts.map(x=>x.reserved))||1,n=pts.length-1||1;
  const X=i=>P+(W-P-5)*i/n,Y=b=>H-20-(H-30)*b/maxY,line=k=>pts.map((x,i)=>X(i).toFixed(1)+","+Y(x[k]).toFixed(1)).join(" ");
  let marks="",last="",lx=-99;pts.forEach((x,i)=>{const k=x.step+":"+x.phase;if(k!==last){last=k;marks+='<line x1="'+X(i)+'" x2="'+X(i)+'" y1="10" y2="'+(H-20)+'" stroke="#dde" />';if(X(i)-lx>55){lx=X(i);marks+='<text x="'+(X(i)+2)+'" y="'+(H-6)+'" font-size="10" fill="#667">'+esc(x.phase)+" "+x.step+"</text>"}}});
  $("#timeline").innerHTML='<svg viewBox="0 0 '+W+" "+H+'" preserveAspectRatio="none">'+marks+
   '<text x="2" y="14" font-size="11">'+fmt(maxY)+'</text><text x="2" y="'+(H-22)+'" font-size="11">0</text>'+
   '<polyline fill="none" stroke="#f59e0b" stroke-width="1.5" points="'+line("reserved")+'"/><polyline fill="none" stroke="#3563e9" stroke-width="1.5" points="'+line("allocated")+'"/></svg>'+
   '<div class="legend"><span><i style="background:#3563e9"></i>allocated</span><span><i style="background:#f59e0b"></i>reserved</span><span class="muted">'+t.length+" points of "+(d.events||t.length)+" allocator events</span></div>"}
async function advise(){const d=await api("/v1/advise",body());const ts=d.techniques||[],c=d.combination;
  $("#advise").innerHTML=(d.baseline?"<p>Baseline "+fmt(d.baseline.total_device)+" of "+fmt(d.capacity)+"</p>":"")+"<ol>"+ts.map(t=>"<li><b>"+esc(t.title)+"</b>"+
   (t.applicable===false?' <span class="tag">n/a: '+esc(t.why_not||"")+"</span>":' — saves '+fmt(t.saving)+" → "+fmt(t.total_device)+", time "+(t.time_cost>=0?"+":"")+(100*t.time_cost).toFixed(0)+"%"+
   '<span class="tag '+(t.fits?"fits":"nofit")+'">'+(t.fits?"fits":"does not fit")+"</span>")+(t.flags?" <code>"+esc(t.flags)+"</code>":"")+(t.note?'<div class="note">'+esc(t.note)+"</div>":"")+"</li>").join("")+"</ol>"+
   (c?"<p><b>Suggested combination:</b> <code>"+esc(c.flags||"(none needed)")+"</code> → "+fmt(c.total_device)+(c.fits?' <span class="tag fits">fits</span>':' <span class="tag nofit">does not fit</span>')+"</p>":"")}
async function plan(){const b=body();b.top=5;const d=await api("/v1/plan",b);const t=d.top||[];
  if(!t.length){$("#plan").textContent="no layout fits"+(d.why?": "+JSON.stringify(d.why):"");return}
  $("#plan").innerHTML="<table><thead><tr><th>#</th><th class=n>TP</th><th class=n>PP</th><th class=n>DP</th><th class=n>ZeRO</th><th>recompute</th><th>precision</th><th>optimizer</th><th class=n>batch</th><th class=n>accum</th><th class=n>per GPU</th><th class=n>step s</th><th class=n>tok/s</th></tr></thead><tbody>"+
   t.map((r,i)=>"<tr><td>"+(i+1)+"</td><td class=n>"+r.tp+"</td><td class=n>"+r.pp+"</td><td class=n>"+r.dp+"</td><td class=n>"+r.zero+"</td><td>"+esc(r.recompute)+"</td><td>"+esc(r.precision||"")+"</td><td>"+esc(r.optimizer||"")+"</td><td class=n>"+r.batch+
   "</td><td class=n>"+r.grad_accum+"</td><td class=n>"+fmt(r.per_gpu.total_device)+"</td><td class=n>"+(r.time?r.time.step_seconds.toFixed(3):"")+"</td><td class=n>"+(r.time?Math.round(r.time.tokens_per_second).toLocaleString("en-US"):"")+"</td></tr>").join("")+"</tbody></table>"+
   '<p class="note">'+(d.assumptions||[]).map(esc).join("<br>")+"</p>"}
async function init(){const q=new URLSearchParams(location.search);
  $("#config-file").addEventListener("change",async e=>{const f=e.target.files[0];if(!f){CONFIG=null;return}
    try{CONFIG=JSON.parse(await f.text());$("#config-note").textContent="using "+f.name+" (choose a preset to go back)";showError("")}
    catch(err){CONFIG=null;showError(f.name+": not valid JSON ("+err.message+")")}});
  $("#model").addEventListener("change",()=>{CONFIG=null;$("#config-file").value=""});
  for(const f of FIELDS){const v=q.get(f);if(v!==null&&f!=="model"&&f!=="gpu")$("#"+f).value=v}
  try{const[m,g]=await Promise.all([api("/v1/models"),api("/v1/gpus")]);
   setOpts($("#model"),m.models.map(x=>({v:x.name,t:x.name+" ("+x.model_type+")"})),q.get("model")||"llama-3.2-1b");
   setOpts($("#gpu"),g.gpus.map(x=>({v:x.name,t:x.name+" ("+gib(x.memory).replace(/\.00$/,"")+" GiB)"})),q.get("gpu")||"A100-80GB")}
  catch(e){showError("could not load presets: "+e.message)}
  document.body.dataset.ready="1";if(q.get("model"))$("#run").click()}
$("#form").addEventListener("submit",e=>{e.preventDefault();run("estimate",$("#run"),estimate)});
$("#btn-timeline").onclick=e=>run("timeline",e.target,timeline);
$("#btn-advise").onclick=e=>run("advise",e.target,advise);
$("#btn-plan").onclick=e=>run("plan",e.target,plan);
for(const f of FIELDS)$("#"+f).addEventListener("change",syncUrl);
init();
</script>
</body>
</html>
)GPUMEMHTML";

}  // namespace gpumem::server
