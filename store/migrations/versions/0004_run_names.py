"""Rename runs.mean_accepted to mean_acceptance_length: tokens per target call, bonus token included (vLLM's word).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("mean_accepted", new_column_name="mean_acceptance_length")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("mean_acceptance_length", new_column_name="mean_accepted")
