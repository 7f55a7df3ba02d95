// Live refresh by polling: the page's `load` runs every REFRESH_MS while the tab is visible,
// and after every action, so the page stays current without a reload.

import { ApiError, storedKey } from "./api.js";
import { $, showMessage } from "./dom.js";

const REFRESH_MS = 5000;

let load = null; // the page's load function, once polling has started
let keyRefused = null; // what a 401 or 403 means: auth.js signs out
let refreshing = null; // the refresh under way, if any

// Starts the 5 s timer; called once per page view, after the first sign-in.
export function startPolling(pageLoad, onKeyRefused) {
  load = pageLoad;
  keyRefused = onKeyRefused;
  setInterval(() => {
    // Hidden tabs and signed-out pages make no calls.
    if (!document.hidden && storedKey()) refresh();
  }, REFRESH_MS);
}

// One refresh at a time: a click during a poll waits for it rather than racing it. A failed
// refresh leaves the last data on screen with a message, which the next good one clears.
export async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      await load();
      $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      if ($("#message").classList.contains("message-stale")) showMessage("");
    } catch (error) {
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) keyRefused(error);
      else showMessage(`Could not refresh: ${error.message}`, "stale");
    } finally {
      refreshing = null;
    }
  })();
  return refreshing;
}

// Runs an action from a button, then `done` (by default a refresh, so the page shows its
// effect); the action's error, if any, goes to the message line.
export async function act(action, done = refresh) {
  try {
    await action();
    showMessage("");
    await done();
  } catch (error) {
    showMessage(error.message);
  }
}
