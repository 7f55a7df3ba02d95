// gpuq dashboard: the entry module, loaded by shell.html as <script type="module">.
//
// The HTML pages hold no data. After sign-in (auth.js) the page's module reads everything
// from the JSON API (api.js) and draws it as text (dom.js), again every few seconds
// (refresh.js). Plain ES modules, no build step and no dependencies.
//
// A page module exports `load()`, which redraws its data, and may export `setup()`, which
// adds its listeners once; `data-page` on <body> says which page this is.

import { loadEndpoints } from "./api.js";
import { keyRefused, setupSignIn } from "./auth.js";
import * as batch from "./pages/batch.js";
import * as batches from "./pages/batches.js";
import * as job from "./pages/job.js";
import * as jobs from "./pages/jobs.js";
import * as overview from "./pages/overview.js";
import * as rules from "./pages/rules.js";
import * as schedules from "./pages/schedules.js";
import * as workers from "./pages/workers.js";
import * as models from "./pages/models.js";
import * as gpus from "./pages/gpus.js";
import * as keys from "./pages/keys.js";
import { refresh, startPolling } from "./refresh.js";

const PAGES = { overview, jobs, job, batches, batch, schedules, rules, workers, models, gpus, keys };
const name = document.body.dataset.page;
const page = PAGES[name];

// The navigation marks the current page; one job counts as the jobs page, one batch as the batches page.
const SECTION = { job: "jobs", batch: "batches" };
for (const a of document.querySelectorAll("nav a")) {
  if (a.dataset.nav === (SECTION[name] || name)) a.classList.add("current");
}

let started = false;

// Runs after each accepted sign-in: the first one sets the page up and starts polling
// (marked started before the first await, so two quick sign-ins cannot start it twice).
setupSignIn(async () => {
  if (!started) {
    started = true;
    await loadEndpoints();
    if (page.setup) page.setup();
    startPolling(page.load, keyRefused);
  }
  await refresh();
});
