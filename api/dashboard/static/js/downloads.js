// A batch's output and error files as download buttons (the batches list and a batch's page).
// A plain link would not send the admin key, so the file is fetched with it and handed to the
// browser as a download named after the batch.

import { fetchWithKey } from "./api.js";
import { button, el, showMessage } from "./dom.js";

async function download(fileId, name) {
  const response = await fetchWithKey(`/v1/files/${encodeURIComponent(fileId)}/content`);
  const url = URL.createObjectURL(await response.blob());
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000); // once the browser has taken it
}

export function batchFiles(b) {
  const offer = (fileId, label, suffix) =>
    fileId
      ? button(label, () => download(fileId, `${b.id}-${suffix}.jsonl`).catch((error) => showMessage(error.message)), {
          "data-file": suffix,
        })
      : "";
  return el("span", { class: "downloads" }, offer(b.output_file_id, "Output", "output"), offer(b.error_file_id, "Errors", "errors"));
}
