"""Each loader on a fixture in its dataset's exact format, and bad files named precisely."""

import json

import pytest

from whale.tasks import UnknownTask, load_task

HOTPOT = [
    {
        "_id": "5a8b57f25542995d1e6f1371",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
        "context": [
            [
                "Scott Derrickson",
                [
                    "Scott Derrickson (born July 16, 1966) is an American director.",
                    " He lives in LA.",
                ],
            ],
            ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]],
            ["Doctor Strange", ["Doctor Strange is a 2016 film."]],
        ],
    }
]
MUSIQUE = [
    {
        "id": "2hop__1",
        "question": "Who founded the company that makes the Model S?",
        "answer": "Martin Eberhard",
        "answer_aliases": ["Eberhard"],
        "answerable": True,
        "paragraphs": [
            {
                "idx": 0,
                "title": "Model S",
                "paragraph_text": "The Model S is made by Tesla.",
                "is_supporting": True,
            },
            {
                "idx": 1,
                "title": "Tesla",
                "paragraph_text": "Tesla was founded by Martin Eberhard.",
                "is_supporting": True,
            },
            {
                "idx": 2,
                "title": "Ford",
                "paragraph_text": "Ford makes cars.",
                "is_supporting": False,
            },
        ],
    },
    {"id": "2hop__2", "question": "q?", "answer": "", "answerable": False, "paragraphs": []},
]
TWOWIKI = [
    {
        "_id": "abc123",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War?",
        "answer": "Małgorzata Braunek",
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 2]],
        "context": [
            [
                "Polish-Russian War (film)",
                ["Polish-Russian War is a 2009 film.", "It was directed by Xawery Żuławski."],
            ],
            [
                "Xawery Żuławski",
                [
                    "Xawery Żuławski is a director.",
                    "His father is Andrzej.",
                    "His mother is Małgorzata Braunek.",
                ],
            ],
        ],
        "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"]],
    }
]


def write(tmp_path, name, data):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in data) + "\n")
    else:
        path.write_text(json.dumps(data, ensure_ascii=False))
    return path


def test_hotpotqa_distractor(tmp_path):
    task = load_task(f"hotpotqa:{write(tmp_path, 'h.json', HOTPOT)}")
    (q,) = task.questions()
    assert q.id == "hotpotqa:5a8b57f25542995d1e6f1371" and q.reference["answer"] == "yes"
    by_id = {p.id: p for p in task.passages}
    assert [by_id[g].title for g in q.reference["supporting"]] == ["Scott Derrickson", "Ed Wood"]
    assert len(task.passages) == 3


def test_hotpotqa_fullwiki_takes_its_corpus_from_the_abstracts_file(tmp_path):
    record = {k: v for k, v in HOTPOT[0].items() if k != "context"}
    abstracts = tmp_path / "abstracts.jsonl"
    abstracts.write_text(
        "\n".join(
            json.dumps({"id": t, "title": t, "text": f"{t} was American."})
            for t in ["Scott Derrickson", "Ed Wood", "Tim Burton"]
        )
        + "\n"
    )
    task = load_task(
        f"hotpotqa:{write(tmp_path, 'fw.json', [record])}", config={"abstracts": str(abstracts)}
    )
    assert len(task.passages) == 3 and len(task.questions()[0].reference["supporting"]) == 2


def test_musique_skips_unanswerable_and_keeps_aliases(tmp_path):
    task = load_task(f"musique:{write(tmp_path, 'm.jsonl', MUSIQUE)}")
    (q,) = task.questions()
    assert q.reference["aliases"] == ["Eberhard"] and len(q.reference["supporting"]) == 2
    assert task.grade(q, "eberhard").correct


def test_2wiki(tmp_path):
    task = load_task(f"2wiki:{write(tmp_path, 'w.json', TWOWIKI)}")
    (q,) = task.questions()
    assert q.reference["type"] == "compositional" and len(q.reference["supporting"]) == 2


def test_missing_field_names_file_record_and_field(tmp_path):
    bad = [dict(HOTPOT[0]), {k: v for k, v in HOTPOT[0].items() if k != "answer"}]
    path = write(tmp_path, "bad.json", bad)
    with pytest.raises(UnknownTask, match=r"bad.json: record 1: missing field 'answer'"):
        load_task(f"hotpotqa:{path}")


def test_wrong_type_names_the_field(tmp_path):
    bad = [dict(MUSIQUE[0], question=42)]
    with pytest.raises(UnknownTask, match=r"record 0: field 'question' is int"):
        load_task(f"musique:{write(tmp_path, 'bad.jsonl', bad)}")


def test_truncated_json_names_the_file(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(TWOWIKI)[:-40])
    with pytest.raises(UnknownTask, match=r"cut.json: not valid JSON"):
        load_task(f"2wiki:{path}")


def test_gold_passage_missing_from_the_corpus_is_an_error_at_load(tmp_path):
    bad = [dict(HOTPOT[0], supporting_facts=[["Scott Derrickson", 0], ["Nobody", 0]])]
    with pytest.raises(UnknownTask, match=r"supporting title 'Nobody' is not in the corpus"):
        load_task(f"hotpotqa:{write(tmp_path, 'g.json', bad)}")
