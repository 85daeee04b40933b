// src/server/page.hpp — the page GET / serves. A placeholder: replace
// kIndexHtml with the real front end (same origin: it calls /v1/...).
#pragma once

namespace gpumem::server {

inline constexpr const char* kIndexHtml = R"html(<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>gpumem</title></head>
<body>
<h1>gpumem</h1>
<p>GPU memory prediction service. JSON API:</p>
<ul>
<li><code>POST /v1/estimate</code>, <code>/v1/fit</code>, <code>/v1/plan</code>, <code>/v1/sweep</code>,
<code>/v1/advise</code>, <code>/v1/doctor</code>, <code>/v1/timeline</code> (JSON body)</li>
<li><code>POST /v1/snapshot</code> (raw snapshot file, query <code>alloc-conf</code>, <code>device</code>)</li>
<li><code>GET /v1/models</code>, <code>/v1/gpus</code>, <code>/healthz</code></li>
</ul>
</body>
</html>
)html";

}  // namespace gpumem::server
