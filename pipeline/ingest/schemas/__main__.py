"""``python -m pipeline.ingest.schemas``: writes record.schema.json and manifest.schema.json
again from the code (after a change to the record's fields, a column type or a format)."""

from pipeline.ingest.schemas import write_files

if __name__ == "__main__":
    print("wrote", ", ".join(write_files()))
