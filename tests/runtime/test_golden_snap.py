"""The golden comparison forgives only the CPU's kernels (``golden.snapped``): a float64 score's last bits and a
candidate probability on a 4-decimal rounding boundary; a changed token, node or larger number still differs."""

import golden


def test_snapping_takes_kernel_noise_as_recorded_and_keeps_every_real_change():
    record = [{"commits": [{"token": 7, "margin": 0.0517904505784077}], "nodes": [{"top": [[3, 0.1322]]}]}]
    noise = [{"commits": [{"token": 7, "margin": 0.051790450578407754}], "nodes": [{"top": [[3, 0.1323]]}]}]
    assert golden.canonical(golden.snapped(noise, record)) == golden.canonical(record)
    changed = [
        [{"commits": [{"token": 8, "margin": 0.0517904505784077}], "nodes": [{"top": [[3, 0.1322]]}]}],
        [{"commits": [{"token": 7, "margin": 0.0517904506}], "nodes": [{"top": [[3, 0.1322]]}]}],
        [{"commits": [{"token": 7, "margin": 0.0517904505784077}], "nodes": [{"top": [[3, 0.1324]]}]}],
        [{"commits": [{"token": 7, "margin": 0.0517904505784077}], "nodes": [{"top": [[4, 0.1322]]}]}],
    ]
    for live in changed:
        assert (
            golden.canonical(golden.snapped(live, record))
            == golden.canonical(live)
            != golden.canonical(record)
        )
