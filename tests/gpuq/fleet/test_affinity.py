"""How affinity rules decide, and the placement filters built on them."""

import pytest

from gpuq.fleet.affinity import GpuTarget, Rule, decide, glob_problem, model_pattern_problem
from gpuq.fleet.placement import (
    Candidate,
    PlacementRequest,
    can_ever_run,
    evaluate,
    explain_unplaceable,
    group_for,
    preview,
)


def make_gpus(*sizes_gib: int, host: str = "node1") -> list[GpuTarget]:
    return [GpuTarget(f"GPU-{i}", i, f"NVIDIA Test {s}G", host, s * 1024) for i, s in enumerate(sizes_gib)]


FLEET = make_gpus(24, 24, 48, 80)
TEXT_ON_0_1 = Rule(1, "llama-*", None, "allow", gpu_indices=(0, 1))
EMBED_ON_2_3 = Rule(2, "*", "embed", "allow", gpu_indices=(2, 3))


def allowed(rules, model, kind):
    return [g.index for g in FLEET if decide(rules, model, kind, g).allowed]


def test_without_rules_every_model_may_run_everywhere():
    assert allowed([], "anything", "generate") == [0, 1, 2, 3]


def test_an_allow_rule_confines_its_models_and_leaves_others_alone():
    assert allowed([TEXT_ON_0_1], "llama-3-8b", "generate") == [0, 1]
    assert allowed([TEXT_ON_0_1], "mistral-7b", "generate") == [0, 1, 2, 3]


def test_the_typical_split_text_on_0_1_embeddings_on_2_3():
    rules = [TEXT_ON_0_1, EMBED_ON_2_3]
    assert allowed(rules, "llama-3-8b", "generate") == [0, 1]
    assert allowed(rules, "bge-small", "embed") == [2, 3]
    # llama-* as an embedder: both rules are relevant; each GPU goes to the rule selecting it.
    assert allowed(rules, "llama-3-8b", "embed") == [0, 1, 2, 3]


def test_a_deny_rule_excludes_gpus_and_higher_precedence_wins():
    no_small = Rule(3, "*", None, "deny", gpu_indices=(0, 1))
    assert allowed([no_small], "any", "generate") == [2, 3]
    exception = Rule(4, "tiny", None, "allow", precedence=10, gpu_indices=(0,))
    assert allowed([no_small, exception], "tiny", "generate") == [0]
    decision = decide([no_small, exception], "tiny", "generate", FLEET[1])
    assert not decision.allowed and decision.rule_id == 3 and "rule 3" in decision.reason


def test_selectors_combine_uuid_name_host_and_memory():
    big = Rule(5, "*", None, "allow", min_memory_mib=40 * 1024, host_pattern="node*", gpu_name_pattern="*Test*")
    assert allowed([big], "m", "generate") == [2, 3]
    by_uuid = Rule(6, "m", None, "allow", gpu_uuids=("GPU-3",))
    assert allowed([by_uuid], "m", "generate") == [3]


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("llama-*", None), ("a b", "may use only"), ("llama-[3", "unclosed"), ("a:b", "may use only")],
)
def test_model_patterns_are_checked(pattern, problem):
    found = model_pattern_problem(pattern)
    assert (found is None) if problem is None else (problem in found)


def test_name_patterns_may_have_spaces_but_not_broken_sets():
    assert glob_problem("*NVIDIA H100*") is None
    assert "unclosed" in glob_problem("*[H100*")
    assert "empty" in glob_problem("  ")


def test_the_filter_chain_gives_every_reason_a_gpu_is_dropped():
    gpus = [Candidate(t, t.memory_total_mib) for t in FLEET]
    request = PlacementRequest("llama-70b", "generate", vram_mib=46_682)
    verdicts = evaluate(request, gpus, can_ever_run([TEXT_ON_0_1]))
    assert [v.ok for v in verdicts] == [False, False, False, False]
    assert verdicts[0].reasons == ["too small: the model needs 46682 MiB, the GPU has 24576 MiB"]
    assert verdicts[3].reasons == ["not allowed: allow rules confine this model to other GPUs"]
    message = explain_unplaceable(request, verdicts)
    assert message.startswith("no GPU, nor GPUs of one host together, may run generate jobs of model 'llama-70b'")

    free_for_big = evaluate(request, gpus, can_ever_run([]))
    assert [v.gpu.target.index for v in free_for_big if v.ok] == [2, 3]


def test_the_preview_explains_each_gpu():
    gpus = [Candidate(t, t.memory_total_mib) for t in FLEET]
    rows = preview(PlacementRequest("llama-3-8b", "generate", 30_000), gpus, [TEXT_ON_0_1])
    assert [(r.allowed, r.fits) for r in rows] == [(True, False), (True, False), (False, True), (False, True)]
    assert rows[0].reasons[0] == "rule 1: allow llama-* selects this GPU"
    assert rows[0].reasons[1] == "too small: the model needs 30000 MiB, the GPU has 24576 MiB"


def test_the_preview_says_what_the_memory_figure_counts():
    gpus = [Candidate(t, t.memory_total_mib) for t in FLEET]
    basis = "estimate for generation with K=8 sequences of 8192 tokens"
    rows = preview(PlacementRequest("llama-3-8b", "generate", 14_374, basis), gpus, [])
    assert rows[0].reasons[1] == f"fits: needs 14374 MiB of 24576 MiB ({basis})"
    assert rows[1].reasons[1] == f"fits: needs 14374 MiB of 24576 MiB ({basis})"


def test_a_model_no_single_gpu_holds_gets_the_smallest_group_on_one_host():
    gpus = [Candidate(t, t.memory_total_mib) for t in FLEET + make_gpus(80, 80, host="node2")]
    group = group_for(PlacementRequest("llama-405b", "generate", 150 * 1024), gpus, [])
    assert [(g.target.host, g.target.index) for g in group] == [("node2", 0), ("node2", 1)]  # 160 GiB in 2 GPUs
    assert group_for(PlacementRequest("small", "generate", 1024), gpus, []) == ()  # one GPU is enough
    only_node1 = Rule(9, "*", None, "allow", host_pattern="node1")
    group = group_for(PlacementRequest("llama-405b", "generate", 150 * 1024), gpus, [only_node1])
    assert [g.target.index for g in group] == [0, 2, 3]  # 80 + 48 + 24 GiB: the fewest of node1 that hold it
    assert group_for(PlacementRequest("huge", "generate", 500 * 1024), gpus, []) == ()
