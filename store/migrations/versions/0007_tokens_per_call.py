"""Rename runs.mean_acceptance_length to tokens_per_call: what the column holds (tokens emitted ÷ target calls, every
call counted). vLLM's mean acceptance length (1 + accepted ÷ drafts, drafting steps only) differs from it wherever a
proposer drafts on some calls only (n-gram lookup), and is kept under that name in a run's summary.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("mean_acceptance_length", new_column_name="tokens_per_call")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("tokens_per_call", new_column_name="mean_acceptance_length")
