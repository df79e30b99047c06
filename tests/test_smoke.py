import trio
from affidavit.statemachine import Outcome, Phase, Retry


def test_contract_sizes() -> None:
    assert (len(Phase), len(Outcome), len(Retry)) == (5, 4, 6)


async def test_trio_mode_runs() -> None:
    await trio.sleep(0)
