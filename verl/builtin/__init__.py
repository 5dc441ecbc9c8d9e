"""The built-in tasks and tiny models that the embedded defaults train on, created on first use.

This package sits above the library: it uses the config, the datasets' writers and the SFT trainer
(to warm the tiny models up), and nothing in the library imports it. The entry points
(``main_ppo``, the SFT and reward-model trainers, ``verl.doctor``) call :mod:`verl.builtin.assets`
before a run, which writes whatever built-in file or model the config names and is still missing.

* :mod:`verl.builtin.task`: the embedded default's arithmetic task, tokenizer and model architecture;
* :mod:`verl.builtin.warmup`: the tiny model's SFT warm-up;
* :mod:`verl.builtin.tool_task`: the multi-turn tool task and its model (``tool_agent_trainer``);
* :mod:`verl.builtin.arith`, :mod:`verl.builtin.tool_arith`: the tasks' rows and parquet writers.
"""
