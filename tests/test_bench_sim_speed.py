"""bench.sim_speed's verdict: a run below the 100× target at 128 instances exits 1 and says
which point and why (it exited 1 with nothing said: a newcomer saw a failure and no reason)."""

from __future__ import annotations

from bench import sim_speed


def test_a_run_below_the_target_says_which_point_and_why(monkeypatch, capsys):
    def fake_point(n, instances, scale, policy, tree=""):  # the child's row, without running it
        speed = 150.0 if scale == 1.0 else 40.0
        return {"instances": instances, "rate_scale": scale, "requests": int(n), "sim_time_s": 100.0,
                "wall_s": 100.0 / speed, "cpu_s": 0.5, "sim_speed": speed, "sim_speed_cpu": 200.0,
                "completed": int(n), "mean_ttft_ms": 1.0}

    monkeypatch.setattr(sim_speed, "point", fake_point)
    assert sim_speed.main(["--requests", "30", "--skip-full"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["below the 100× target: 128 instances at 8× load ran at 40× the wall clock "
                   "(200× per CPU second: on a busy machine the wall clock counts others' work)"]


def test_a_run_that_meets_it_exits_0_and_says_nothing_more(monkeypatch, capsys):
    monkeypatch.setattr(sim_speed, "point", lambda n, instances, scale, policy, tree="": {
        "instances": instances, "rate_scale": scale, "requests": 30, "sim_time_s": 100.0, "wall_s": 0.5,
        "cpu_s": 0.5, "sim_speed": 200.0, "sim_speed_cpu": 200.0, "completed": 30, "mean_ttft_ms": 1.0})
    assert sim_speed.main(["--requests", "30", "--skip-full"]) == 0
    assert capsys.readouterr().err == ""
