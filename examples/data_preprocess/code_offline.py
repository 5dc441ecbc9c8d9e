"""Small Python programming problems with test cases, built in (no download).

    python examples/data_preprocess/code_offline.py --local_dir ~/data/code_offline
    python examples/data_preprocess/code_offline.py --local_dir ~/data/code_offline --test_size 10 --seed 1

44 problems, half in each test-case style of verl's code datasets (APPS / TACO layout):
standard input/output (``{"inputs": [...], "outputs": [...]}``) and function call
(``{"fn_name": ..., "inputs": [[args...], ...], "outputs": [...]}``). The ground truth is that
dict as JSON text (the two styles do not share one parquet type); a reference solution is kept in
extra_info["solution"]. data_source ``code_offline`` is scored by
verl.utils.reward_score.code: each case runs in the local sandbox, and the score is the fraction
of cases passed. ``--test_size`` problems, picked by a seeded shuffle, form the test split.
The rows also suit ``tool_agent`` with the ``code_interpreter`` tool (docs/agents.md).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from verl.utils.dataset.schema import make_row, write_splits

DATA_SOURCE = "code_offline"

# (statement, reference program, [(stdin, stdout), ...])
STDIN_PROBLEMS = [
    ("Read an integer n and print 1 + 2 + ... + n.", "n = int(input())\nprint(n * (n + 1) // 2)",
     [("3\n", "6\n"), ("10\n", "55\n"), ("1\n", "1\n"), ("100\n", "5050\n")]),
    ("Read two integers on one line and print their sum.", "a, b = map(int, input().split())\nprint(a + b)",
     [("2 3\n", "5\n"), ("-4 10\n", "6\n"), ("0 0\n", "0\n")]),
    ("The first line has n, the second n integers. Print the largest of them.",
     "input()\nprint(max(map(int, input().split())))",
     [("3\n1 5 2\n", "5\n"), ("4\n-1 -7 -3 -2\n", "-1\n"), ("1\n9\n", "9\n")]),
    ("Read a line of text and print it reversed.", "print(input()[::-1])",
     [("hello\n", "olleh\n"), ("ab c\n", "c ba\n"), ("x\n", "x\n")]),
    ("Read a line of text and print how many vowels (a, e, i, o, u, either case) it has.",
     "print(sum(c in 'aeiouAEIOU' for c in input()))",
     [("hello world\n", "3\n"), ("AEIOU xyz\n", "5\n"), ("rhythm\n", "0\n")]),
    ("Read an integer n (0 <= n <= 20) and print n! (n factorial).",
     "import math\nprint(math.factorial(int(input())))",
     [("0\n", "1\n"), ("5\n", "120\n"), ("10\n", "3628800\n")]),
    ("Read n and print the numbers 1 to n, one per line, but Fizz for multiples of 3, Buzz for "
     "multiples of 5 and FizzBuzz for multiples of both.",
     "for i in range(1, int(input()) + 1):\n    print('Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0) or i)",
     [("3\n", "1\n2\nFizz\n"), ("5\n", "1\n2\nFizz\n4\nBuzz\n"),
      ("15\n", "1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz\n")]),
    ("Read an integer n >= 1 and print YES if it is prime, otherwise NO.",
     "n = int(input())\nprint('YES' if n > 1 and all(n % d for d in range(2, int(n**0.5) + 1)) else 'NO')",
     [("7\n", "YES\n"), ("1\n", "NO\n"), ("15\n", "NO\n"), ("2\n", "YES\n"), ("97\n", "YES\n")]),
    ("The first line has n, the second n integers. Print how many of them are even.",
     "input()\nprint(sum(int(x) % 2 == 0 for x in input().split()))",
     [("5\n1 2 3 4 6\n", "3\n"), ("3\n1 3 5\n", "0\n"), ("2\n0 -2\n", "2\n")]),
    ("Read two positive integers and print their greatest common divisor.",
     "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))",
     [("12 18\n", "6\n"), ("7 5\n", "1\n"), ("100 75\n", "25\n")]),
    ("Read a line and print how many words (separated by spaces) it has.", "print(len(input().split()))",
     [("the quick brown fox\n", "4\n"), ("  one  \n", "1\n"), ("a b c d e\n", "5\n")]),
    ("Read n >= 1 and print the n-th Fibonacci number, where F(1) = F(2) = 1.",
     "a, b = 0, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)",
     [("1\n", "1\n"), ("10\n", "55\n"), ("20\n", "6765\n")]),
    ("The first line has n, the second n integers. Print the smallest and the largest, separated by a space.",
     "input()\nxs = list(map(int, input().split()))\nprint(min(xs), max(xs))",
     [("3\n4 1 9\n", "1 9\n"), ("1\n5\n", "5 5\n"), ("4\n-3 0 3 -8\n", "-8 3\n")]),
    ("Read a non-negative integer and print the sum of its digits.", "print(sum(map(int, input().strip())))",
     [("12345\n", "15\n"), ("0\n", "0\n"), ("909\n", "18\n")]),
    ("Read a word and print YES if it reads the same backwards, otherwise NO.",
     "w = input().strip()\nprint('YES' if w == w[::-1] else 'NO')",
     [("racecar\n", "YES\n"), ("abca\n", "NO\n"), ("a\n", "YES\n")]),
    ("Read an integer n and print n*1, n*2, n*3, n*4 and n*5 on one line, separated by spaces.",
     "n = int(input())\nprint(*(n * i for i in range(1, 6)))",
     [("2\n", "2 4 6 8 10\n"), ("7\n", "7 14 21 28 35\n"), ("0\n", "0 0 0 0 0\n")]),
    ("The first line has n, the second n integers. Print them in increasing order, separated by spaces.",
     "input()\nprint(*sorted(map(int, input().split())))",
     [("4\n3 1 2 2\n", "1 2 2 3\n"), ("1\n0\n", "0\n"), ("3\n-1 10 5\n", "-1 5 10\n")]),
    ("The first line is a word, the second a single character. Print how often the character occurs in the word.",
     "word = input()\nprint(word.count(input()))",
     [("banana\na\n", "3\n"), ("hello\nz\n", "0\n"), ("aaa\na\n", "3\n")]),
    ("The first line has n, the second n integers. Print their average with exactly two decimals.",
     "input()\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / len(xs):.2f}')",
     [("3\n1 2 3\n", "2.00\n"), ("2\n1 2\n", "1.50\n"), ("4\n10 0 0 0\n", "2.50\n")]),
    ("Read an integer n >= 1 and print YES if it is a power of two, otherwise NO.",
     "n = int(input())\nprint('YES' if n & (n - 1) == 0 else 'NO')",
     [("1\n", "YES\n"), ("6\n", "NO\n"), ("64\n", "YES\n"), ("96\n", "NO\n")]),
    ("Read n and print n lines: the i-th line has i stars (*).",
     "for i in range(1, int(input()) + 1):\n    print('*' * i)",
     [("3\n", "*\n**\n***\n"), ("1\n", "*\n"), ("4\n", "*\n**\n***\n****\n")]),
    ("Read a line and print it in upper case.", "print(input().upper())",
     [("Hello, World\n", "HELLO, WORLD\n"), ("abc\n", "ABC\n"), ("123 go\n", "123 GO\n")]),
]  # fmt: skip

# (signature, statement, reference function, [(args, result), ...])
FUNCTION_PROBLEMS = [
    ("reverse_string(s)", "returns the string s reversed.", "def reverse_string(s):\n    return s[::-1]",
     [(["abc"], "cba"), ([""], ""), (["racecar"], "racecar")]),
    ("square(x)", "returns x squared.", "def square(x):\n    return x * x",
     [([3], 9), ([-4], 16), ([0], 0)]),
    ("is_even(n)", "returns True if the integer n is even, else False.", "def is_even(n):\n    return n % 2 == 0",
     [([4], True), ([7], False), ([0], True)]),
    ("count_words(s)", "returns the number of space-separated words in s.",
     "def count_words(s):\n    return len(s.split())",
     [(["hello world"], 2), ([""], 0), ([" a  b c "], 3)]),
    ("max_of(nums)", "returns the largest number of the non-empty list nums.",
     "def max_of(nums):\n    return max(nums)",
     [([[1, 5, 3]], 5), ([[-2, -9]], -2), ([[7]], 7)]),
    ("sum_list(nums)", "returns the sum of the list nums (0 for an empty list).",
     "def sum_list(nums):\n    return sum(nums)",
     [([[1, 2, 3]], 6), ([[]], 0), ([[-1, 1]], 0)]),
    ("capitalize_words(s)", "returns s with the first letter of each space-separated word in upper case.",
     "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
     [(["hello world"], "Hello World"), (["python is fun"], "Python Is Fun"), (["x"], "X")]),
    ("remove_duplicates(nums)", "returns nums without repeated values, keeping first occurrences in order.",
     "def remove_duplicates(nums):\n    return list(dict.fromkeys(nums))",
     [([[1, 2, 1, 3, 2]], [1, 2, 3]), ([[]], []), ([[5, 5, 5]], [5])]),
    ("count_chars(s)", "returns a dict mapping each character of s to how often it occurs.",
     "from collections import Counter\n\ndef count_chars(s):\n    return dict(Counter(s))",
     [(["aab"], {"a": 2, "b": 1}), ([""], {}), (["xyz"], {"x": 1, "y": 1, "z": 1})]),
    ("fizzbuzz(n)", 'returns "FizzBuzz" if n is a multiple of 15, "Fizz" of 3, "Buzz" of 5, else str(n).',
     "def fizzbuzz(n):\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)",
     [([3], "Fizz"), ([5], "Buzz"), ([15], "FizzBuzz"), ([7], "7")]),
    ("is_anagram(a, b)", "returns True if the strings a and b are anagrams of each other.",
     "def is_anagram(a, b):\n    return sorted(a) == sorted(b)",
     [(["listen", "silent"], True), (["abc", "abd"], False), (["", ""], True)]),
    ("second_largest(nums)", "returns the second largest distinct value in nums (it has at least two).",
     "def second_largest(nums):\n    return sorted(set(nums))[-2]",
     [([[1, 3, 2]], 2), ([[5, 5, 4]], 4), ([[10, -1]], -1)]),
    ("flatten(lists)", "returns the concatenation of the lists inside the list lists.",
     "def flatten(lists):\n    return [x for inner in lists for x in inner]",
     [([[[1, 2], [3], []]], [1, 2, 3]), ([[[]]], []), ([[["a"], ["b", "c"]]], ["a", "b", "c"])]),
    ("celsius_to_fahrenheit(c)", "converts c degrees Celsius to Fahrenheit.",
     "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
     [([0], 32.0), ([100], 212.0), ([-40], -40.0), ([37.5], 99.5)]),
    ("gcd(a, b)", "returns the greatest common divisor of the non-negative integers a and b.",
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
     [([12, 18], 6), ([7, 5], 1), ([0, 9], 9)]),
    ("count_primes(n)", "returns how many prime numbers are smaller than n.",
     "def count_primes(n):\n    return sum(all(k % d for d in range(2, k)) for k in range(2, n))",
     [([10], 4), ([2], 0), ([30], 10)]),
    ("merge_sorted(a, b)", "merges the two sorted lists a and b into one sorted list.",
     "def merge_sorted(a, b):\n    return sorted(a + b)",
     [([[1, 4], [2, 3]], [1, 2, 3, 4]), ([[], [1]], [1]), ([[1, 1], [1]], [1, 1, 1])]),
    ("longest_word(s)", "returns the longest space-separated word of s (the first one if several are longest).",
     "def longest_word(s):\n    return max(s.split(), key=len)",
     [(["a bb ccc"], "ccc"), (["hi there you"], "there"), (["one two"], "one")]),
    ("digits(n)", "returns the list of the decimal digits of the non-negative integer n.",
     "def digits(n):\n    return [int(d) for d in str(n)]",
     [([123], [1, 2, 3]), ([0], [0]), ([907], [9, 0, 7])]),
    ("running_sum(nums)", "returns the list of prefix sums of nums.",
     "def running_sum(nums):\n    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out",
     [([[1, 2, 3]], [1, 3, 6]), ([[]], []), ([[5, -5]], [5, 0])]),
    ("is_palindrome(s)", "returns True if s reads the same backwards, ignoring upper/lower case.",
     "def is_palindrome(s):\n    return s.lower() == s.lower()[::-1]",
     [(["Level"], True), (["abc"], False), ([""], True)]),
    ("mean(nums)", "returns the arithmetic mean of the non-empty list nums.",
     "def mean(nums):\n    return sum(nums) / len(nums)",
     [([[1, 2, 3, 4]], 2.5), ([[5]], 5.0), ([[-1, 1]], 0.0)]),
]  # fmt: skip


def stdin_problem(statement: str, solution: str, cases: list[tuple[str, str]]) -> tuple[str, dict, str]:
    """(prompt, ground truth, reference solution) of a standard input/output problem."""
    example_in, example_out = cases[0]
    prompt = (
        f"{statement}\n\nExample input:\n{example_in}\nExample output:\n{example_out}\n"
        "Write a complete Python 3 program that reads standard input and prints the answer. "
        "Put the program in a ```python code block."
    )
    truth = {"inputs": [i for i, _ in cases], "outputs": [o for _, o in cases]}
    return prompt, truth, solution


def function_problem(
    signature: str, statement: str, solution: str, cases: list[tuple[list, object]]
) -> tuple[str, dict, str]:
    """(prompt, ground truth, reference solution) of a function-call problem."""
    fn_name = signature.split("(")[0]
    args, result = cases[0]
    call = f"{fn_name}({', '.join(map(repr, args))})"
    prompt = (
        f"Write a Python function `{signature}` that {statement}\n\n"
        f"Example: {call} returns {result!r}.\nPut the function in a ```python code block."
    )
    truth = {"fn_name": fn_name, "inputs": [a for a, _ in cases], "outputs": [r for _, r in cases]}
    return prompt, truth, solution


def all_problems() -> list[tuple[str, dict, str]]:
    """Every built-in problem as (prompt, ground truth, reference solution), in a fixed order."""
    return [stdin_problem(*p) for p in STDIN_PROBLEMS] + [function_problem(*p) for p in FUNCTION_PROBLEMS]


def make_rows(problems: list[tuple[str, dict, str]], split: str) -> list[dict]:
    return [
        make_row(
            DATA_SOURCE, prompt, "code", json.dumps(truth), split, index, extra_info={"solution": solution}
        )
        for index, (prompt, truth, solution) in enumerate(problems)
    ]


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--local_dir", default="~/data/code_offline", help="folder to write train/test.parquet to"
    )
    parser.add_argument("--test_size", type=int, default=8, help="problems held out for the test split")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the shuffle that picks the test problems"
    )
    args = parser.parse_args(argv)
    problems = all_problems()
    if not 0 < args.test_size < len(problems):
        parser.error(f"--test_size must be between 1 and {len(problems) - 1}, got {args.test_size}")
    random.Random(f"code_offline:{args.seed}").shuffle(problems)
    rows = {
        "train": make_rows(problems[args.test_size :], "train"),
        "test": make_rows(problems[: args.test_size], "test"),
    }
    paths = write_splits(rows, args.local_dir)
    for split, path in paths.items():
        print(f"wrote {len(rows[split])} {split} rows to {path}")
    return paths


if __name__ == "__main__":
    main()
