// Calls to gpuq's JSON API, made with the admin key typed into the sign-in form.
//
// The key lives in this tab's sessionStorage: gone when the tab closes, never in a cookie
// (so the browser never sends it on its own, and there is no CSRF surface). It is kept
// here, not in auth.js, because every call reads it and auth.js itself calls the API.

const KEY_STORAGE = "gpuq.adminKey";

export const storedKey = () => sessionStorage.getItem(KEY_STORAGE);
export const storeKey = (key) => sessionStorage.setItem(KEY_STORAGE, key);
export const forgetKey = () => sessionStorage.removeItem(KEY_STORAGE);

// A refused call: `status` lets callers tell a bad key (401, 403) from anything else.
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

// A call with the key that resolves to the Response when it succeeded (a file's content, say)
// and throws an ApiError carrying the API's own `detail` when it did not.
export async function fetchWithKey(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${storedKey() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    const data = await response.json().catch(() => null);
    throw new ApiError(response.status, (data && data.detail) || `${method} ${path}: HTTP ${response.status}`);
  }
  return response;
}

// One JSON call; a body, if any, is sent as JSON. Resolves to the parsed response (null for
// 204), or throws as fetchWithKey does.
export async function api(path, options = {}) {
  const response = await fetchWithKey(path, options);
  return response.status === 204 ? null : response.json();
}

// "?a=1&b=x&b=y" from {a: 1, b: ["x", "y"], c: ""}: empty values are left out, so an unset
// filter field does not become an empty filter.
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    for (const v of [].concat(value)) if (v !== "" && v !== null && v !== undefined) search.append(name, v);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// Which endpoints this server has, from its own OpenAPI document. Pages ask before calling
// an optional endpoint, so a missing one shows a "not available" note instead of a 404 in
// the browser console.
let endpoints = new Set();

export async function loadEndpoints() {
  const response = await fetch("/openapi.json");
  const spec = response.ok ? await response.json() : { paths: {} };
  endpoints = new Set(Object.keys(spec.paths || {}));
}

// `path` as the OpenAPI document spells it, e.g. "/v1/jobs/{job_id}/retry".
export const has = (path) => endpoints.has(path);
