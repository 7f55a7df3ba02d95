// Sign-in: the shells are public, the data is not. The page asks for an API key once, keeps
// it in this tab (api.js), and checks it against /v1/keys/me before showing anything.

import { ApiError, api, forgetKey, storeKey, storedKey } from "./api.js";
import { $, showMessage } from "./dom.js";

function showSignIn(message) {
  $("#page").hidden = true;
  $("#sign-out").hidden = true;
  $("#sign-in").hidden = false;
  showMessage(message || "");
}

function signOut(message) {
  forgetKey();
  $("#who").textContent = "";
  showSignIn(message);
}

// A key refused while the page was open (revoked, or its role changed): back to the form,
// with the reason.
export function keyRefused(error) {
  if (error.status === 401) signOut("The key is no longer valid (unknown or revoked). Sign in again.");
  else signOut("This key is not an admin key: the dashboard needs an admin key.");
}

// Shows the page if this tab holds an admin key, else the sign-in form; `entered` then
// starts or refreshes the page.
async function enter(entered) {
  if (!storedKey()) return showSignIn();
  // Any valid key may read /v1/keys/me; checking the role first means a submitter's key
  // gets one clear sentence, not a page of 403s.
  let me;
  try {
    me = await api("/v1/keys/me");
  } catch (error) {
    return signOut(error instanceof ApiError && error.status === 401 ? `This key was refused: ${error.message}` : error.message);
  }
  if (me.role !== "admin") {
    return signOut(`This key is not an admin key (it is a ${me.role} key for "${me.owner}"): the dashboard needs an admin key.`);
  }
  $("#who").textContent = `${me.name} (${me.owner})`;
  $("#sign-in").hidden = true;
  $("#sign-out").hidden = false;
  $("#page").hidden = false;
  showMessage("");
  await entered();
}

// Adds the form's listeners (once) and enters with the key this tab already holds, if any;
// `entered` runs after each accepted sign-in.
export function setupSignIn(entered) {
  $("#sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    storeKey($("#key").value.trim());
    $("#key").value = "";
    enter(entered);
  });
  $("#sign-out").addEventListener("click", () => signOut("Signed out."));
  enter(entered);
}
