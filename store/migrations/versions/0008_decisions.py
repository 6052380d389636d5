"""Add decisions: the one decision a query over some sessions led to, made once and read by every page.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_key", sa.String(200), nullable=False),
        sa.Column("query_key", sa.String(300), nullable=False),
        sa.Column("runs_seen", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
        sa.UniqueConstraint("session_key", "query_key", name="uq_decisions_session_key_query_key"),
    )


def downgrade() -> None:
    op.drop_table("decisions")
