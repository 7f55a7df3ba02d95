"""What the Ollama model routes show a submitter (issue 24 item 6), on both databases."""

from tests.api.conftest import bearer
from tests.conftest import both_databases

MODEL = "smollm2-135m"


@both_databases
def test_show_names_the_models_file_but_not_where_the_server_keeps_it(client, make_key):
    shown = client.post("/api/show", json={"model": MODEL}, headers=bearer(make_key("submitter", "acme")))
    assert shown.status_code == 200, shown.text
    modelfile = shown.json()["modelfile"]
    assert "FROM " in modelfile and modelfile.endswith(".gguf\n") and "/" not in modelfile
