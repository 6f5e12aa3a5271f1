"""The real-size projection (``dex_core.evaluation.bench.projection``): every term as its formula says, the
bandwidth-bound compute and the priced link classes, each computed here by hand on made-up tables."""

import pytest

from dex_core.analysis.collectives import CONTROL_COLUMNS
from dex_core.evaluation.bench.projection import (
    LINKS,
    Link,
    Pricing,
    columns,
    parse_link,
    peak_bandwidth,
    project,
)

TABLES = {  # seconds, made up so that each term can be computed by hand
    "layer": {1: 1.0, 2: 2.0, 4: 3.0},
    "head": {1: 10.0, 2: 11.0, 4: 12.0},
    "proposal": {1: 0.5, 2: 0.6, 4: 0.8},
    "adapter": {1: 0.1, 2: 0.2, 4: 0.3},
    "tp": {2: {"layer": 0.6, "head": 5.0}},
    "links": {2: {"exchange": {1: 0.05, 2: 0.06, 4: 0.08}, "p2p": 0.02, "all_reduce": 0.03}},
    # weight bytes of each part, and of one hidden row
    "bytes": {
        "layer": 100,
        "head": 1000,
        "proposal": 50,
        "adapter": 10,
        "row": 4,
        "tp": {2: {"layer": 60, "head": 500}},
    },
}
RUN = {"batch_sizes": [[2, 1], [4, 3]], "tokens": 2, "host_seconds_per_round": 0.25}  # two rounds, K = 2


def test_the_projection_adds_every_term_as_its_formula_says():
    got = project(TABLES, 4, RUN)  # 4 layers on K = 2 explorers: 2 each
    # round 1: stage 0 = 2 x 2.0 + 0.6 + 0.2 = 4.8, stage 1 = 2 x 1.0 + 10 = 12 -> 12
    # round 2: stage 0 = 2 x 3.0 + 0.8 + 0.3 = 7.1, stage 1 = 2 x 2.5 + 11.5 = 16.5 (3 rows: between 2 and 4)
    assert got["dex"]["compute"] == pytest.approx((12 + 16.5) / 2)
    assert got["dex"]["host"] == pytest.approx(0.25 * 2 / 2)
    assert got["dex"]["link"] == pytest.approx((0.06 + 0.08) / 2)  # each round's widest stage's rows
    assert got["dex"]["total"] == pytest.approx(14.25 + 0.25 + 0.07)
    assert got["pipeline_ar"] == pytest.approx({"compute": 4 * 1.0 + 10.0, "link": 1 * 0.02, "total": 14.02})
    assert got["tensor_parallel"] == pytest.approx(
        {"compute": 4 * 0.6 + 5.0, "link": (2 * 4 + 1) * 0.03, "total": 7.67}
    )
    assert got["speedup_over_pipeline_ar"] == pytest.approx(14.02 / 14.57)
    assert got["speedup_over_tensor_parallel"] == pytest.approx(7.67 / 14.57)
    assert got["speedup_over_tensor_parallel_compute_only"] == pytest.approx(7.4 / 14.25)
    assert got["widest_stage_rows"] == 4
    wide = project(TABLES, 4, RUN | {"batch_sizes": [[5, 1]]})  # past the measured rows: not extrapolated
    assert wide["dex"] is None and "speedup_over_pipeline_ar" not in wide
    assert wide["pipeline_ar"]["total"] == pytest.approx(14.02)


def test_each_column_is_the_bandwidth_bound_compute_or_a_priced_link_by_hand():
    # 500 bytes/s of weights (half of a 1,000 peak); one link class: 1 s a step, 2 bytes/s
    pricing = Pricing(
        peak=1000.0, source="test", fraction=0.5, links={"nvlink": Link(latency=1.0, bandwidth=2.0)}
    )
    got = columns(TABLES, 4, RUN, pricing)
    assert {link: set(by) for link, by in got.items()} == {
        link: {"measured", "bandwidth_bound"} for link in ("measured", "nvlink")
    }
    assert got["measured"]["measured"] == project(TABLES, 4, RUN)
    bound = got["measured"][
        "bandwidth_bound"
    ]  # layer 100/500 = 0.2 s at any rows, head 2, light head 0.1, adapter 0.02
    assert bound["dex"]["compute"] == pytest.approx(
        2 * 0.2 + 2.0
    )  # each round: the final stage, 2 layers + head
    assert bound["dex"]["link"] == pytest.approx((0.06 + 0.08) / 2)  # the links as measured
    assert bound["pipeline_ar"]["total"] == pytest.approx(4 * 0.2 + 2.0 + 0.02)
    assert bound["tensor_parallel"]["total"] == pytest.approx(4 * 60 / 500 + 500 / 500 + 9 * 0.03)

    # priced: p2p = 1 + 4/2 = 3 s; all-reduce over 2 = 2 x 1 + 2 x 1/2 x 4/2 = 4 s; a round's exchange of n rows =
    # a send of n rows (1 + 4n/2) + the choices' all-gather over 2 ((1 + (n + 1) x 8 CONTROL_COLUMNS / 2))
    def exchange(n):
        return 1 + 4 * n / 2 + 1 + (n + 1) * 8 * CONTROL_COLUMNS / 2

    nvlink = got["nvlink"]["measured"]
    assert nvlink["pipeline_ar"]["total"] == pytest.approx(14.0 + 1 * 3)
    assert nvlink["tensor_parallel"]["total"] == pytest.approx(7.4 + 9 * 4)
    assert nvlink["dex"]["link"] == pytest.approx((exchange(2) + exchange(4)) / 2)
    assert nvlink["dex"]["compute"] == pytest.approx(14.25) and nvlink["dex"]["host"] == pytest.approx(0.25)
    assert got["nvlink"]["bandwidth_bound"]["tensor_parallel"]["total"] == pytest.approx(1.48 + 9 * 4)
    assert columns(TABLES, 4, RUN, None).keys() == {"measured"}  # a device of unknown peak: measured only


def test_a_device_s_peak_comes_from_its_name_and_a_link_from_the_command_line():
    assert peak_bandwidth("NVIDIA H100 80GB HBM3") == (3.35e12, "published (H100)")
    assert peak_bandwidth("NVIDIA H100 PCIe")[0] == 2.0e12 and peak_bandwidth("NVIDIA H200")[0] == 4.8e12
    assert peak_bandwidth("NVIDIA L40S")[0] == 864e9 and peak_bandwidth("NVIDIA L4")[0] == 300e9
    assert peak_bandwidth("cpu (x86_64, 2 threads)")[1] == "assumed (a CPU)"
    assert peak_bandwidth("Some New GPU") is None
    assert parse_link("pcie=4e-6,32e9") == ("pcie", Link(latency=4e-6, bandwidth=32e9))
    for bad in ("pcie=4e-6", "usb=1e-6,1e9", "nvlink=1e-6,0", "nvlink"):
        with pytest.raises(ValueError, match="CLASS=LATENCY,BANDWIDTH|a link class is one of"):
            parse_link(bad)
    said = Pricing(
        peak=4.8e12, source="published (H200)", links=dict(LINKS, pcie=Link(4e-6, 32e9)), given={"pcie"}
    )
    described = said.describe()
    assert described["bandwidth_bytes_per_second"] == pytest.approx(0.8 * 4.8e12)
    assert described["fraction_source"] == "assumed" and described["links"]["nvlink"]["source"] == "assumed"
    assert described["links"]["pcie"] == {
        "latency_seconds": 4e-6,
        "bytes_per_second": 32e9,
        "source": "given",
    }
